-- docker compose: the target database kafka2postgres writes into, beside the source
-- database (run once, when the postgres volume is first initialised).
CREATE DATABASE "walcast_target" OWNER "walcast";
