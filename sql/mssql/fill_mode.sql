-- gap-healer, SQL Server: can this login fill through the installed procedure?
-- OBJECT_ID is NULL when the procedure is absent or invisible to the login;
-- HAS_PERMS_BY_NAME is NULL for an unknown securable, 0 without the right.
SELECT
    CAST(
        CASE
            WHEN
                OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P') IS NOT NULL
                AND HAS_PERMS_BY_NAME(
                    N'__schema__.[gap_healer_fill]', N'OBJECT', N'EXECUTE'
                ) = 1
                THEN 1
            ELSE 0
        END AS BIT
    ) AS use_procedure;
