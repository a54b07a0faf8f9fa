# Included by templates/CMakeLists.txt. The attention templates are compiled
# through the Highway backend (generator/highway: the generated per-key
# sources and hwy_generic.cc, which is attention_key-inl.h with every
# constant at its default). This target compiles the templates once more on
# their own, with no generator involved, to show they are valid C++ by
# themselves: `cmake --build BUILD --target g3_templates_selfcheck`.
add_library(g3_templates_selfcheck OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/attention_selfcheck.cc)
target_include_directories(g3_templates_selfcheck PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(g3_templates_selfcheck PRIVATE hwy::hwy)
