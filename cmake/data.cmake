# spool_stage_data(SRC DST TARGET): mirror SRC into DST at build time; every *.xz file is
# decompressed (xz -dc) instead of copied. Re-runs when a source file changes.
function(spool_stage_data src dst target)
  file(GLOB_RECURSE files RELATIVE ${src} CONFIGURE_DEPENDS ${src}/*)
  set(outputs)
  foreach(rel IN LISTS files)
    get_filename_component(reldir ${rel} DIRECTORY)
    if(rel MATCHES "\\.xz$")
      string(REGEX REPLACE "\\.xz$" "" out ${rel})
      add_custom_command(OUTPUT ${dst}/${out}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${dst}/${reldir}
        COMMAND xz -dc ${src}/${rel} > ${dst}/${out}.part
        COMMAND ${CMAKE_COMMAND} -E rename ${dst}/${out}.part ${dst}/${out}
        DEPENDS ${src}/${rel}
        COMMENT "Unpacking ${rel}" VERBATIM)
      list(APPEND outputs ${dst}/${out})
    else()
      add_custom_command(OUTPUT ${dst}/${rel}
        COMMAND ${CMAKE_COMMAND} -E copy_if_different ${src}/${rel} ${dst}/${rel}
        DEPENDS ${src}/${rel} VERBATIM)
      list(APPEND outputs ${dst}/${rel})
    endif()
  endforeach()
  add_custom_target(${target} ALL DEPENDS ${outputs})
endfunction()
