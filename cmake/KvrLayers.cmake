# The layer graph, and the include directories that enforce it.
#
# kvr_layer(NAME BELOW <layers> HEADERS <headers>) declares a layer, its
# public headers (in include/kvrelay/) and the layers directly below it. The
# layer may see its own headers and those of every layer below it, directly
# or not, and nothing else: build/layers/NAME/kvrelay/ holds links to exactly
# those public headers, and kvr_layer_target() puts that folder and the
# source folders (private headers) of the same layers on a target's include
# path. include/kvrelay itself is on no target's path, so an upward include
# is a "file not found" error (tests/layering checks that it is).

set(KVR_LAYER_ROOT ${CMAKE_BINARY_DIR}/layers)

function(kvr_layer name)
  cmake_parse_arguments(L "" "" "BELOW;HEADERS" ${ARGN})
  set(sees ${name})
  foreach(below IN LISTS L_BELOW)
    get_property(known GLOBAL PROPERTY KVR_LAYER_${below}_SEES SET)
    if(NOT known)
      message(FATAL_ERROR "layer ${name}: layer ${below} below it is not "
                          "declared yet (declare layers bottom up)")
    endif()
    get_property(below_sees GLOBAL PROPERTY KVR_LAYER_${below}_SEES)
    list(APPEND sees ${below_sees})
  endforeach()
  list(REMOVE_DUPLICATES sees)
  set_property(GLOBAL PROPERTY KVR_LAYER_${name}_SEES ${sees})
  set_property(GLOBAL PROPERTY KVR_LAYER_${name}_HEADERS ${L_HEADERS})
  set_property(GLOBAL APPEND PROPERTY KVR_LAYER_HEADERS ${L_HEADERS})

  set(dir ${KVR_LAYER_ROOT}/${name}/kvrelay)
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir})
  foreach(layer IN LISTS sees)
    get_property(headers GLOBAL PROPERTY KVR_LAYER_${layer}_HEADERS)
    foreach(h IN LISTS headers)
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/kvrelay/${h} ${dir}/${h}
           SYMBOLIC)
    endforeach()
  endforeach()
endfunction()

# Every public header belongs to exactly one layer.
function(kvr_layer_check_headers)
  get_property(owned GLOBAL PROPERTY KVR_LAYER_HEADERS)
  file(GLOB present RELATIVE ${PROJECT_SOURCE_DIR}/include/kvrelay
       ${PROJECT_SOURCE_DIR}/include/kvrelay/*.h)
  foreach(h IN LISTS present)
    list(FIND owned ${h} at)
    if(at EQUAL -1)
      message(FATAL_ERROR "include/kvrelay/${h} belongs to no layer: add it "
                          "to a kvr_layer() in CMakeLists.txt")
    endif()
  endforeach()
  set(seen "")
  foreach(h IN LISTS owned)
    if(h IN_LIST seen)
      message(FATAL_ERROR "include/kvrelay/${h} is declared by two layers")
    endif()
    list(APPEND seen ${h})
  endforeach()
endfunction()

# Compiles target as part of layer: it sees that layer's headers, public and
# private, and those of the layers below, and so does whatever links it (a
# higher layer or a test).
function(kvr_layer_target target layer)
  get_property(sees GLOBAL PROPERTY KVR_LAYER_${layer}_SEES)
  if(NOT sees)
    message(FATAL_ERROR "${target}: layer ${layer} is not declared")
  endif()
  set(dirs ${KVR_LAYER_ROOT}/${layer})
  foreach(l IN LISTS sees)
    if(EXISTS ${PROJECT_SOURCE_DIR}/src/${l})
      list(APPEND dirs ${PROJECT_SOURCE_DIR}/src/${l})
    endif()
  endforeach()
  target_include_directories(${target} PUBLIC ${dirs})
endfunction()
