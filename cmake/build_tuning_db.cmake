# cmake -DFLASHJIT=<flashjit CLI> -DSQL=<text DB> -DDB=<output .db> -P build_tuning_db.cmake
# Builds a shippable tuning DB from its text form: `flashjit db merge` into a scratch DB, then
# `flashjit db export` (a single file in rollback-journal mode, so that it opens read-only from a
# read-only folder). The build (cmake/tuning_dbs.cmake) and tests/cli/package_test.cpp run it.
foreach(var FLASHJIT SQL DB)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "build_tuning_db.cmake: -D${var}=... is required")
  endif()
endforeach()
set(scratch "${DB}.scratch")
file(REMOVE "${DB}" "${scratch}" "${scratch}-wal" "${scratch}-shm")
get_filename_component(dir "${DB}" DIRECTORY)
file(MAKE_DIRECTORY "${dir}")
execute_process(COMMAND "${FLASHJIT}" db merge "${scratch}" "${SQL}" RESULT_VARIABLE merged
                OUTPUT_QUIET)
if(merged EQUAL 0)
  execute_process(COMMAND "${FLASHJIT}" db export --db "${scratch}" "${DB}"
                  RESULT_VARIABLE exported OUTPUT_QUIET)
endif()
file(REMOVE "${scratch}" "${scratch}-wal" "${scratch}-shm")
if(NOT merged EQUAL 0 OR NOT exported EQUAL 0)
  file(REMOVE "${DB}")
  message(FATAL_ERROR "building ${DB} from ${SQL} failed (see the flashjit error above)")
endif()
