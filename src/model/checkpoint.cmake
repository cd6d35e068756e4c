# Safetensors parsing and Hugging Face checkpoint directories. Included from
# this folder's CMakeLists.txt; paths are relative to this file so that the
# fuzz build can reuse the sources.
add_library(basalt_checkpoint
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cc
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cc)
target_link_libraries(basalt_checkpoint
  PUBLIC basalt_core
  PRIVATE nlohmann_json::nlohmann_json)

basalt_test(basalt_checkpoint_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cc ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cc
  LIBS basalt_checkpoint nlohmann_json::nlohmann_json)
