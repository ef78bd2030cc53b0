# docs/: every relative link and anchor in docs/*.md and README.md resolves, and no source
# comment cites files outside the repository (cmake/check_docs.cmake).
add_test(NAME docs_links COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
         -P ${CMAKE_SOURCE_DIR}/cmake/check_docs.cmake)
set_tests_properties(docs_links PROPERTIES LABELS cpu)
