-- turnkeeper schema version 28 (issue 20, "the outbox carries what it delivers"): a
-- delivery operation names the session entry it delivers (DeliveryStep.entry_id),
-- checked to exist in the run's session when the plan is created
-- (storage/ops/outbox_plans.py create_plan); a worker reads the entry beside its
-- claim (store.outbox.delivered_entry) instead of guessing an entry id.
--
-- No backfill: an operation planned before this version names no entry (NULL).

ALTER TABLE delivery_operations ADD COLUMN entry_id VARCHAR;
