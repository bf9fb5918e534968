# spool_stage_data(SRC DST TARGET): mirror SRC into DST at build time. Re-runs when a source
# file changes.
#   *.tar.xz  a solid archive (files that share most of their bytes, e.g. a checkpoint and the
#             same weights as GGUF, compress to little more than one of them): its members,
#             whose paths are relative to DST, are extracted into DST.
#   *.xz      decompressed (xz -dc) to the same path without .xz.
#   others    copied.
function(spool_stage_data src dst target)
  file(GLOB_RECURSE files RELATIVE ${src} CONFIGURE_DEPENDS ${src}/*)
  set(outputs)
  foreach(rel IN LISTS files)
    get_filename_component(reldir ${rel} DIRECTORY)
    if(rel MATCHES "\\.tar\\.xz$")
      # The member list is read at configure time; a changed archive re-runs the configure step.
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src}/${rel})
      execute_process(COMMAND tar -tJf ${src}/${rel} OUTPUT_VARIABLE members RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "cannot list ${src}/${rel} (tar -tJf exit ${rc})")
      endif()
      string(REGEX REPLACE "\n$" "" members "${members}")
      string(REPLACE "\n" ";" members "${members}")
      set(outs)
      foreach(m IN LISTS members)
        if(NOT m MATCHES "/$")
          list(APPEND outs ${dst}/${m})
        endif()
      endforeach()
      add_custom_command(OUTPUT ${outs}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${dst}
        COMMAND tar -xJf ${src}/${rel} -C ${dst} --touch
        DEPENDS ${src}/${rel}
        COMMENT "Unpacking ${rel}" VERBATIM)
      list(APPEND outputs ${outs})
    elseif(rel MATCHES "\\.xz$")
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
