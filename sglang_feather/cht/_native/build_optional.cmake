# cmake -P script: configure and build the compiled Chunked Hash Tree (this folder's CMakeLists.txt) in BUILD_DIR and
# copy the module to MODULE_DIR, which then holds the module or nothing. Any failure is a warning, not an error
# (unless MODE is REQUIRED): the package installs without the module and runs the Python tree.
cmake_minimum_required(VERSION 3.15)

file(REMOVE_RECURSE "${MODULE_DIR}")
file(MAKE_DIRECTORY "${MODULE_DIR}")

function(give_up what)
  string(CONCAT text "sglang-feather: ${what}, so the compiled Chunked Hash Tree is not built and the Python tree "
                     "(about 26x slower) will run. Install a C++17 compiler (g++, clang++, Xcode's command line "
                     "tools) and reinstall, or see the build output above.")
  if(MODE STREQUAL "REQUIRED")
    message(FATAL_ERROR "${text} (SGLANG_FEATHER_NATIVE=REQUIRED)")
  endif()
  message(WARNING "${text}")
endfunction()

if(NOT EXISTS "${BUILD_DIR}/CMakeFiles/cmake.check_cache")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BUILD_DIR}" -G "${GENERATOR}" -C "${INIT_CACHE}"
    RESULT_VARIABLE configured)
  if(NOT configured EQUAL 0)
    file(REMOVE_RECURSE "${BUILD_DIR}")
    give_up("configuring the compiled tree failed")
    return()
  endif()
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --config Release RESULT_VARIABLE built)
if(NOT built EQUAL 0)
  give_up("compiling the compiled tree failed")
  return()
endif()
file(GLOB_RECURSE modules "${BUILD_DIR}/_tree*.so" "${BUILD_DIR}/_tree*.pyd")
if(NOT modules)
  give_up("the build produced no _tree module")
  return()
endif()
file(COPY ${modules} DESTINATION "${MODULE_DIR}")
