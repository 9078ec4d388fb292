-- gap-healer, SQL Server: the installed fill procedure as this login sees it
-- (MssqlEngine::fill_mode, and `gap-healer check`). Two result sets:
--   1. one row: whether the procedure exists (OBJECT_ID is NULL when it is
--      absent or invisible to the login) and whether the login may execute
--      it (HAS_PERMS_BY_NAME is NULL for an unknown securable, 0 without the
--      right);
--   2. its parameters, in order. A login with EXECUTE on the procedure sees
--      them (metadata visibility follows any permission on the object); it
--      cannot read the definition (OBJECT_DEFINITION needs VIEW DEFINITION).
--      The engine compares them with the procedure it would install: an older
--      gap-healer's procedure, which took the tombstone stream and type as
--      parameters, is not used.
SELECT
    CAST(
        CASE
            WHEN OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P') IS NULL THEN 0
            ELSE 1
        END AS BIT
    ) AS procedure_exists,
    CAST(
        CASE
            WHEN
                HAS_PERMS_BY_NAME(
                    N'__schema__.[gap_healer_fill]', N'OBJECT', N'EXECUTE'
                ) = 1
                THEN 1
            ELSE 0
        END AS BIT
    ) AS procedure_execute;

SELECT p.name AS parameter_name
FROM sys.parameters AS p
WHERE p.object_id = OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P')
ORDER BY p.parameter_id;
