# The floor plan: which folder's code may include which. A folder may include its own
# headers and those of the folders listed for it, nothing else (no upward or sideways
# arrows). pentad_check_floors() reads every #include "..." of every source under these
# folders and reports each one that breaks the plan. The top-level CMakeLists.txt calls it
# at configure time (FATAL_ERROR); `cmake -P cmake/floors.cmake` runs it as a test.
# tests/, bench/ and scripts may use anything.
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.25)
endif()
set(PENTAD_FLOORS
  "core:"
  "kernels:core"
  "parallel:core,kernels"
  "optim:core,kernels,parallel"
  "checkpoint:core,kernels,parallel"
  "src/data:core"
  "src/model:core,kernels"
  "src/recipe:core,kernels,parallel,optim,checkpoint,src/data,src/model"
  "src/plan:core,kernels,parallel,optim,checkpoint,src/data,src/model,src/recipe"
  "src/train:core,kernels,parallel,optim,checkpoint,src/data,src/model,src/recipe,src/plan"
  "src/cli:core,kernels,parallel,optim,checkpoint,src/data,src/model,src/recipe,src/plan,src/train"
  "launch:core,kernels,parallel,optim,checkpoint,src/data,src/model,src/recipe,src/plan,src/train,src/cli"
)

# The folder an include names: "parallel/pp/x.h" -> parallel, "model/x.h" -> src/model
# (src/ is on the include path too).
function(_pentad_include_folder include out)
  string(REGEX MATCH "^[^/]+" first "${include}")
  if(first MATCHES "^(core|kernels|parallel|optim|checkpoint|launch)$")
    set(${out} "${first}" PARENT_SCOPE)
  elseif(first MATCHES "^(data|model|recipe|plan|train|cli)$")
    set(${out} "src/${first}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)  # a system or third-party header
  endif()
endfunction()

function(pentad_check_floors mode)
  get_filename_component(root "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/.." ABSOLUTE)
  set(broken "")
  foreach(rule ${PENTAD_FLOORS})
    string(REPLACE ":" ";" parts "${rule}")
    list(GET parts 0 folder)
    list(LENGTH parts n)
    set(allowed "${folder}")
    if(n GREATER 1)
      list(GET parts 1 below)
      string(REPLACE "," ";" below "${below}")
      list(APPEND allowed ${below})
    endif()
    file(GLOB_RECURSE files "${root}/${folder}/*.h" "${root}/${folder}/*.cpp"
         "${root}/${folder}/*.cu" "${root}/${folder}/*.cuh")
    foreach(path ${files})
      file(STRINGS "${path}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
      foreach(line ${lines})
        string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
        _pentad_include_folder("${inc}" target)
        file(RELATIVE_PATH rel "${root}" "${path}")
        if(target AND NOT target IN_LIST allowed)
          list(JOIN allowed ", " may)
          string(APPEND broken "\n  ${rel} includes \"${inc}\": ${folder} may use only ${may}")
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(broken)
    message(${mode} "pentad: includes that break the floor plan (cmake/floors.cmake):${broken}")
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  pentad_check_floors(FATAL_ERROR)
  message(STATUS "pentad: every include follows the floor plan")
endif()
