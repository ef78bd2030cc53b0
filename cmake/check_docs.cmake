# Run by the docs_links test (tests/docs.cmake) with cmake -P, SOURCE_DIR = the source tree.
#  1. Every relative link in docs/*.md and README.md points at a file of the tree, and a
#     "#anchor" at a heading of the linked page (GitHub's heading ids).
#  2. No source file, script or README cites files outside the repository (../shared/,
#     SEMANTICS.md, DESIGN.md): docs/ holds what they said.
cmake_minimum_required(VERSION 3.24)
set(problems "")

# GitHub's id of a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'.
function(heading_ids md out)
  file(STRINGS ${md} lines REGEX "^#+ ")
  set(ids "")
  foreach(h ${lines})
    string(REGEX REPLACE "^#+ +" "" h "${h}")
    string(TOLOWER "${h}" h)
    string(REGEX REPLACE "[^a-z0-9 _-]" "" h "${h}")
    string(REPLACE " " "-" h "${h}")
    list(APPEND ids "${h}")
  endforeach()
  set(${out} "${ids}" PARENT_SCOPE)
endfunction()

file(GLOB pages ${SOURCE_DIR}/docs/*.md)
list(APPEND pages ${SOURCE_DIR}/README.md)
foreach(page ${pages})
  file(READ ${page} text)
  get_filename_component(dir ${page} DIRECTORY)
  # square brackets and semicolons would confuse CMake's list handling
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "[" "{" text "${text}")
  string(REPLACE "]" "}" text "${text}")
  string(REGEX MATCHALL "}\\([^)]+\\)" links "${text}")
  foreach(link ${links})
    string(LENGTH "${link}" n)
    math(EXPR n "${n} - 3")
    string(SUBSTRING "${link}" 2 ${n} target)   # "}(target)" -> target
    if(target MATCHES "^[a-z]+:")
      continue()   # http(s), mailto: not checked here
    endif()
    string(REGEX REPLACE "#.*$" "" path "${target}")
    set(anchor "")
    if(target MATCHES "#(.+)$")
      set(anchor "${CMAKE_MATCH_1}")
    endif()
    if(path STREQUAL "")
      set(file ${page})
    else()
      get_filename_component(file ${dir}/${path} ABSOLUTE)
    endif()
    if(NOT EXISTS ${file})
      string(APPEND problems "\n  ${page}: link to a missing file: ${target}")
    elseif(anchor AND file MATCHES "\\.md$")
      heading_ids(${file} ids)
      if(NOT anchor IN_LIST ids)
        string(APPEND problems "\n  ${page}: no heading for the anchor: ${target}")
      endif()
    endif()
  endforeach()
endforeach()

file(GLOB_RECURSE sources RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/*.c ${SOURCE_DIR}/*.h ${SOURCE_DIR}/*.cu ${SOURCE_DIR}/*.cuh
     ${SOURCE_DIR}/*.py ${SOURCE_DIR}/*.sh ${SOURCE_DIR}/*.cmake ${SOURCE_DIR}/*CMakeLists.txt)
list(APPEND sources README.md)
foreach(f ${sources})
  if(f MATCHES "^build|/build|^cmake/check_docs.cmake$")
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/${f} hits REGEX "\\.\\./shared/|SEMANTICS\\.md|DESIGN\\.md")
  foreach(h ${hits})
    string(STRIP "${h}" h)
    string(APPEND problems "\n  ${f}: cites a file outside the repository: ${h}")
  endforeach()
endforeach()

if(problems)
  message(FATAL_ERROR "docs check:${problems}")
endif()
message(STATUS "docs check: links and citations fine")
