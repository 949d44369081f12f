-- turnkeeper schema version 8: a write made without a lease (for a target nobody
-- holds) increments its target's lease row, so that it conflicts with a grant or
-- takeover committed meanwhile instead of slipping past it (write skew).

ALTER TABLE leases ADD COLUMN unleased_checks BIGINT NOT NULL DEFAULT 0;
