-- PostgreSQL's additions to schema version 5 (run after storage/migrations/0005_delivery.sql).

-- Claims scan for due operations: by status, then time.
CREATE INDEX delivery_operations_due ON delivery_operations (status, next_attempt_at);
CREATE INDEX delivery_events_by_operation ON delivery_events (operation_id);
