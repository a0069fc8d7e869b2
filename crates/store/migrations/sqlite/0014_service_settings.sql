-- Values the service generates once and keeps with its data, shared by every replica of
-- the database (the development API key of `tollgate serve`; docs/api.md, "Keys").
CREATE TABLE service_settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
