# The shipped tuning DBs (system DBs, read-only; docs/TUNING_DB.md "Shipped DBs"): each
# data/tuning/<name>.sql (the text form of `flashjit db export <name>.sql`, reviewed in git) is
# built into <build>/tuning-dbs/<name>.db by the flashjit CLI (cmake/build_tuning_db.cmake) and
# installed with the package: share/flashjit/tuning/ (cmake --install) or flashjit/tuning/ in
# the Python package. The runtime finds that folder relative to the binary that holds its code
# (runtime.cpp: shipped_tuning_dir()), so an installed tree can be moved.
if(FLASHJIT_PYTHON)
  set(FLASHJIT_INSTALL_TUNINGDIR flashjit/tuning)  # next to the module flashjit/_flashjit*.so
  set(FLASHJIT_TUNING_DIR_FROM_BINARY tuning)
else()
  set(FLASHJIT_INSTALL_TUNINGDIR ${CMAKE_INSTALL_DATADIR}/flashjit/tuning)
  # From bin/ (the CLI, programs installed with it) or lib/ (a shared libflashjit).
  file(RELATIVE_PATH FLASHJIT_TUNING_DIR_FROM_BINARY /prefix/${CMAKE_INSTALL_BINDIR}
       /prefix/${FLASHJIT_INSTALL_TUNINGDIR})
endif()
set_property(SOURCE ${PROJECT_SOURCE_DIR}/runtime/runtime.cpp APPEND PROPERTY COMPILE_DEFINITIONS
             FLASHJIT_TUNING_DIR_FROM_BINARY="${FLASHJIT_TUNING_DIR_FROM_BINARY}")

set(FLASHJIT_TUNING_SQL_DIR ${PROJECT_SOURCE_DIR}/data/tuning CACHE PATH
    "Text tuning DBs (*.sql) to build and install as system DBs")
file(GLOB FLASHJIT_TUNING_SQL CONFIGURE_DEPENDS ${FLASHJIT_TUNING_SQL_DIR}/*.sql)
set(FLASHJIT_TUNING_DBS "")
foreach(sql IN LISTS FLASHJIT_TUNING_SQL)
  get_filename_component(name ${sql} NAME_WE)
  set(db ${PROJECT_BINARY_DIR}/tuning-dbs/${name}.db)
  add_custom_command(
    OUTPUT ${db}
    COMMAND ${CMAKE_COMMAND} -DFLASHJIT=$<TARGET_FILE:flashjit_cli> -DSQL=${sql} -DDB=${db}
            -P ${PROJECT_SOURCE_DIR}/cmake/build_tuning_db.cmake
    DEPENDS ${sql} flashjit_cli ${PROJECT_SOURCE_DIR}/cmake/build_tuning_db.cmake
    COMMENT "Building the tuning DB ${name}.db from data/tuning/${name}.sql")
  list(APPEND FLASHJIT_TUNING_DBS ${db})
endforeach()
add_custom_target(flashjit_tuning_dbs ALL DEPENDS ${FLASHJIT_TUNING_DBS})
# The folder always exists in an install (find_package's flashjit_TUNING_DIR names it).
install(DIRECTORY DESTINATION ${FLASHJIT_INSTALL_TUNINGDIR})
if(FLASHJIT_TUNING_DBS)
  install(FILES ${FLASHJIT_TUNING_DBS} DESTINATION ${FLASHJIT_INSTALL_TUNINGDIR})
endif()
