#!/usr/bin/env bash
# PostgreSQL compose demo, first start only: the postgres image runs this
# (mounted in /docker-entrypoint-initdb.d) as the superuser, in database
# $POSTGRES_DB, when its data volume is empty. It creates the Eventuous
# schema `eventuous` (tests/fixtures/eventuous_postgres.sql), the
# subscriptions' checkpoints, and the healer's login role with exactly the
# grants `gap-healer sql` prints (postgres-grants.sql; CI checks that the two
# still agree). To run it again: `docker compose ... down -v` (drops the volume).
set -euo pipefail

schema=${DEMO_SCHEMA:-eventuous}
role=${GAP_HEALER_ROLE:-gap_healer}
password=${GAP_HEALER_DB_PASSWORD:?the healer role needs a password}
dir=${DEMO_DIR:-/demo}

sql() { psql -v ON_ERROR_STOP=1 -q --no-psqlrc "$@"; }

sed "s/__schema__/$schema/g" "$dir/eventuous_postgres.sql" | sql
sql -c "INSERT INTO $schema.checkpoints (id, position) VALUES ('demo-projection', 0), ('demo-slow-report', 0);"
# The role, its password passed as a psql variable (quoted by psql itself).
sql -v role="$role" -v password="$password" <<'SQL'
CREATE ROLE :"role" LOGIN PASSWORD :'password';
SQL
sql -f "$dir/postgres-grants.sql"
echo "postgres-init: schema $schema (Eventuous), checkpoints demo-projection and demo-slow-report, role $role with the grants of gap-healer sql"
