/* libkvrelay.so is the layer libraries linked whole (see CMakeLists.txt);
 * CMake wants one source of the shared library's own. It carries the
 * version, which the Python package reads to name the library it loaded. */
const char kvr__shared_version[] = KVR_VERSION_STRING;
