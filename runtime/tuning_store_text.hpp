// The text form of a tuning DB (internal to runtime/tuning_store*.cpp): `flashjit db export
// FILE.sql` writes it, `flashjit db merge/import ... FILE.sql` reads it. It is what the repository
// keeps of the shipped DBs (data/tuning/*.sql): reviewable in a diff, built into a SQLite file at
// build time (cmake/build_tuning_db.cmake).
//
//   -- flashjit tuning DB, text form; schema_version 3
//   -- ...comment lines...
//   INSERT INTO devices (device, backend, ...) VALUES ('cuda|NVIDIA H100 ...', 'cuda', ...);
//   INSERT INTO results (device, generator, pass, ...) VALUES (...);
//   INSERT INTO choices (device, generator, pass, ...) VALUES (...);
//
// One row per line, sorted by primary key (so that a re-tune diffs row by row); newlines inside
// text values are written as ' || char(10) || '. The rows of devices, results and choices are
// kept; recorded_problems (a machine's own misses) are not.
#pragma once

#include <filesystem>

#include "generator/error.hpp"
#include "runtime/tuning_store_sqlite.hpp"

namespace flashjit::tuning_db {

// True for a file name ending in ".sql": the text form.
bool is_text_db(const std::filesystem::path& path);

// Writes every row of `db` (devices, results, choices; through the unqualified names, so that an
// older file opened read-only is written as version-3 rows) to `file`.
Status write_text(const Database& db, const std::filesystem::path& file);

// Inserts the rows of the text DB `file` into `db` (a fresh version-3 DB), in one transaction.
// Version-2 text (its lines name the columns they set) reads as plain rows. Errors: NotFound (no
// file), Unsupported (a version other than 2 or 3: the header names it),
// InvalidArgument naming the file and line of anything that is not a comment or one INSERT into
// devices, results or choices.
Status read_text(const Database& db, const std::filesystem::path& file);

}  // namespace flashjit::tuning_db
