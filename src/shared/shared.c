/* libkvrelay.so is the layer libraries linked whole (see CMakeLists.txt);
 * CMake wants one source of the shared library's own. Compiling the umbrella
 * header here checks that every public header stands on its own in C. */
#include "kvrelay/kvrelay.h"
