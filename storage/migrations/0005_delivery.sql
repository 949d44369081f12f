-- turnkeeper schema version 5: the delivery outbox (DESIGN machine 4).
-- An intent (one per run) holds ordered operations; each operation carries its
-- own claim (owner, epoch, expiry), raised by one on every claim.
-- States in the CHECK constraint are the spec's stored states (a test compares them).

CREATE TABLE delivery_intents (
    id                VARCHAR PRIMARY KEY,
    session_id        VARCHAR NOT NULL,
    run_id            VARCHAR NOT NULL UNIQUE,
    platform          VARCHAR NOT NULL,
    target_id         VARCHAR NOT NULL,
    reply_message_id  VARCHAR NOT NULL,
    transport_context VARCHAR NOT NULL,
    plan_digest       VARCHAR NOT NULL,
    status            VARCHAR NOT NULL CHECK (status IN ('pending', 'delivered', 'failed',
                          'uncertain')),
    created_at        TIMESTAMPTZ NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL
);

CREATE TABLE delivery_operations (
    id                  VARCHAR PRIMARY KEY,
    intent_id           VARCHAR NOT NULL,
    operation_key       VARCHAR NOT NULL,
    kind                VARCHAR NOT NULL,
    artifact_id         VARCHAR NOT NULL,
    sequence            INTEGER NOT NULL CHECK (sequence >= 1),
    depends_on          VARCHAR,
    idempotency_key     VARCHAR NOT NULL,
    payload_digest      VARCHAR NOT NULL,
    status              VARCHAR NOT NULL CHECK (status IN ('pending', 'claimed', 'in_progress',
                            'delivered', 'unsupported', 'failed', 'uncertain')),
    provider_asset_id   VARCHAR NOT NULL,
    provider_message_id VARCHAR NOT NULL,
    provider_state      VARCHAR NOT NULL,
    attempt_count       INTEGER NOT NULL CHECK (attempt_count >= 0),
    next_attempt_at     TIMESTAMPTZ,
    failure_code        VARCHAR NOT NULL,
    lease_owner         VARCHAR NOT NULL,
    lease_epoch         BIGINT NOT NULL CHECK (lease_epoch >= 0),
    lease_ttl_s         DOUBLE PRECISION NOT NULL,
    lease_expires_at    TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL,
    updated_at          TIMESTAMPTZ NOT NULL,
    UNIQUE (intent_id, sequence),
    UNIQUE (intent_id, operation_key)
);

CREATE TABLE delivery_events (
    operation_id VARCHAR NOT NULL,
    intent_id    VARCHAR NOT NULL,
    edge         VARCHAR NOT NULL,
    trigger      VARCHAR NOT NULL,
    source       VARCHAR NOT NULL,
    dest         VARCHAR NOT NULL,
    owner        VARCHAR NOT NULL,
    epoch        BIGINT NOT NULL,
    occurred_at  TIMESTAMPTZ NOT NULL
);
