# write_if_changed(PATH CONTENT): writes CONTENT to PATH unless PATH already
# holds it, so that an unchanged generated file rebuilds nothing. Included
# by the scripts that generate sources at build time.
function(write_if_changed path content)
  if(EXISTS "${path}")
    file(READ "${path}" old)
    if(old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE "${path}" "${content}")
endfunction()
