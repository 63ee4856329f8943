# write_if_changed(PATH CONTENT): writes CONTENT to PATH unless PATH already holds exactly
# that, so regenerating an unchanged embedded file does not recompile what includes it.
function(write_if_changed path content)
  if(EXISTS "${path}")
    file(READ "${path}" old)
    if(old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE "${path}" "${content}")
endfunction()
