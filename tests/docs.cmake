# Every relative link in README.md, DESIGN.md and docs/*.md resolves: the
# file exists and, for a #anchor, the page has that heading (a moved section
# must not leave a dead link behind).
add_test(NAME test_docs_links
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_docs_links.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_docs_links PROPERTIES LABELS docs TIMEOUT 60)
