-- turnkeeper schema version 9: the model a run was admitted for is stored on the
-- run itself (it is what run-history analytics group by), so a per-model figure
-- reads one table instead of joining every run to its execution intent.

ALTER TABLE runs ADD COLUMN model VARCHAR DEFAULT '';
UPDATE runs SET model = i.model FROM execution_intents i WHERE i.id = runs.intent_id;
