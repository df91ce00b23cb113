# Which files take the torch precompiled header (src/core/pch.h).
#
# Loading the header costs ~4 s a file, compiling torch/torch.h without it
# ~20 s. A file takes it when it reaches libtorch through its includes:
# directly (<torch/...>, <ATen/...>, <c10/...>) or through any chain of
# Orchard's own headers. Looking only at a file's direct includes missed
# most of them (a stage includes "train/trainer.h", which includes torch):
# 95 files compiled torch without the header, about 40 % of a build.

set(ORCHARD_TORCH_INCLUDE_REGEX "^[ \t]*#[ \t]*include[ \t]*<(torch|ATen|c10)/")

# The quoted includes of FILE, resolved against its folder, src/ and tests/,
# in OUT (absolute paths of the headers that exist).
function(orchard_quoted_includes file out)
  get_filename_component(dir ${file} DIRECTORY)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  set(found "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" name "${line}")
    foreach(base IN ITEMS ${dir} ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
      if(EXISTS ${base}/${name})
        get_filename_component(path ${base}/${name} ABSOLUTE)
        list(APPEND found ${path})
        break()
      endif()
    endforeach()
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# ORCHARD_TORCH_HEADERS: Orchard's headers that reach libtorch, found as a
# fixed point (a header joins when it includes torch or a header already in).
file(GLOB_RECURSE orchard_all_headers CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/src/*.h ${CMAKE_SOURCE_DIR}/tests/*.h)
set(ORCHARD_TORCH_HEADERS "")
set(orchard_pending "")
foreach(header IN LISTS orchard_all_headers)
  file(STRINGS ${header} direct REGEX "${ORCHARD_TORCH_INCLUDE_REGEX}")
  if(direct)
    list(APPEND ORCHARD_TORCH_HEADERS ${header})
  else()
    orchard_quoted_includes(${header} includes)
    string(MAKE_C_IDENTIFIER "${header}" key)
    set(orchard_includes_${key} ${includes})
    list(APPEND orchard_pending ${header})
  endif()
endforeach()
set(orchard_changed TRUE)
while(orchard_changed)
  set(orchard_changed FALSE)
  set(still_pending "")
  foreach(header IN LISTS orchard_pending)
    string(MAKE_C_IDENTIFIER "${header}" key)
    set(reaches FALSE)
    foreach(inc IN LISTS orchard_includes_${key})
      if(inc IN_LIST ORCHARD_TORCH_HEADERS)
        set(reaches TRUE)
        break()
      endif()
    endforeach()
    if(reaches)
      list(APPEND ORCHARD_TORCH_HEADERS ${header})
      set(orchard_changed TRUE)
    else()
      list(APPEND still_pending ${header})
    endif()
  endforeach()
  set(orchard_pending ${still_pending})
endwhile()

# Marks the files among ARGN that do not reach libtorch
# SKIP_PRECOMPILE_HEADERS.
function(orchard_skip_pch_without_torch)
  foreach(src IN LISTS ARGN)
    file(STRINGS ${src} direct REGEX "${ORCHARD_TORCH_INCLUDE_REGEX}")
    set(reaches FALSE)
    if(direct)
      set(reaches TRUE)
    else()
      orchard_quoted_includes(${src} includes)
      foreach(inc IN LISTS includes)
        if(inc IN_LIST ORCHARD_TORCH_HEADERS)
          set(reaches TRUE)
          break()
        endif()
      endforeach()
    endif()
    if(NOT reaches)
      # Nor is it batched (ORCHARD_UNITY): it compiles quickly alone.
      set_source_files_properties(${src} PROPERTIES
        SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endforeach()
endfunction()

# Unity builds (ORCHARD_UNITY, on by default): each target's torch-using
# sources are compiled ORCHARD_UNITY_BATCH at a time as one file. Loading the
# precompiled header and emitting the inline code of torch, CLI11 and the
# standard library cost every file about 6-20 s whatever its size; the 17
# files of src/cli compiled in 31 s together against about 300 s apart
# (2 cores, GCC 12). Names a file keeps to itself must then be unique within
# its target (an anonymous namespace spans the batch).
option(ORCHARD_UNITY "Compile each target's sources in batches (unity build)" ON)
set(ORCHARD_UNITY_BATCH 8 CACHE STRING "Sources per unity batch")
function(orchard_unity target)
  if(ORCHARD_UNITY)
    set_target_properties(${target} PROPERTIES
      UNITY_BUILD ON UNITY_BUILD_MODE BATCH
      UNITY_BUILD_BATCH_SIZE ${ORCHARD_UNITY_BATCH})
  endif()
endfunction()
