-- Which positions inside the tracked ranges exist now (committed rows only:
-- PostgreSQL never shows another transaction's uncommitted insert). One index
-- range scan per range; $1 and $2 are the ranges' starts and ends.
SELECT m.__position__ AS position
FROM UNNEST($1::bigint [], $2::bigint []) AS r (a, b)
INNER JOIN __table__ AS m ON m.__position__ BETWEEN r.a AND r.b;
