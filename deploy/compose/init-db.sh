#!/usr/bin/env bash
# Compose demo, one-shot: creates the database, the Eventuous schema
# (tests/fixtures/eventuous_mssql.sql) and the demo procedures.
# Runs in the SQL Server image; sqlcmd reads the password from SQLCMDPASSWORD.
set -euo pipefail

SQLCMD=/opt/mssql-tools18/bin/sqlcmd
[ -x "$SQLCMD" ] || SQLCMD=/opt/mssql-tools/bin/sqlcmd
db=${DB_NAME:-EventStore}

sql() { "$SQLCMD" -C -b -S "${DB_HOST:-mssql}" -U sa "$@"; }

sql -Q "IF DB_ID(N'$db') IS NULL CREATE DATABASE [$db];"
sql -d "$db" -i /demo/eventuous_mssql.sql
sql -d "$db" -i /demo/demo-procs.sql
echo "init-db: database $db has the Eventuous schema and the demo procedures"
