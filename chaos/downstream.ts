/** The downstream side of the chaos run: what handlers write to, fenced by the attempt token or inside ctx.transaction. */
import { RESULTS_TABLE, STEP_EFFECTS_TABLE, STEP_RUNS_TABLE, TX_EFFECTS_TABLE } from "./config.js";
import { AUDIT_SQL } from "./record-off.js";

/** The downstream table handlers write with fencedWrite, and a trigger-kept log of every write it accepted. */
export const DOWNSTREAM_SQL = `
CREATE TABLE ${RESULTS_TABLE} (
  job_id    bigint  PRIMARY KEY,
  token     integer NOT NULL,
  worker_id text    NOT NULL
);
CREATE TABLE downstream_log (
  n         bigserial   PRIMARY KEY,
  job_id    bigint      NOT NULL,
  token     integer     NOT NULL,
  worker_id text        NOT NULL,
  at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION log_downstream_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO downstream_log (job_id, token, worker_id) VALUES (NEW.job_id, NEW.token, NEW.worker_id);
  RETURN NULL;
END;
$$;
CREATE TRIGGER downstream_write_log AFTER INSERT OR UPDATE ON ${RESULTS_TABLE}
  FOR EACH ROW EXECUTE FUNCTION log_downstream_write();
-- What handlers write inside ctx.transaction, with no constraint to help: the invariant
-- (one row per succeeded job) must come from the fenced completion alone.
CREATE TABLE ${TX_EFFECTS_TABLE} (
  job_id    bigint      NOT NULL,
  attempt   integer     NOT NULL,
  worker_id text        NOT NULL,
  at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Durable jobs (chaos/durable-workload.ts): every time a plain step's body begins, on the
-- handler's own connection, before the step can be recorded; 'began' is the process's clock.
CREATE TABLE ${STEP_RUNS_TABLE} (
  job_id    bigint      NOT NULL,
  name      text        NOT NULL,
  attempt   integer     NOT NULL,
  worker_id text        NOT NULL,
  began     timestamptz NOT NULL,
  at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- What a durable job's ctx.step.transaction writes, with no constraint: once per job, from the
-- fenced record alone.
CREATE TABLE ${STEP_EFFECTS_TABLE} (
  job_id    bigint      NOT NULL,
  attempt   integer     NOT NULL,
  worker_id text        NOT NULL,
  at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
${AUDIT_SQL}`;
