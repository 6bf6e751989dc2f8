-- Messages this schema's consumers sent to a dead-letter topic, open until an operator
-- republishes them: the count behind dlq_message_count and `courier status`, kept in the
-- database because the emulator (and Pub/Sub without Cloud Monitoring) cannot count a
-- subscription's backlog.
CREATE TABLE dead_letter_log (
    consumer_group   text        NOT NULL,
    -- Id of the original message (the dead letter carries it as courier_dlq_message_id).
    message_id       text        NOT NULL,
    subscription     text        NOT NULL,
    ordering_key     text        NOT NULL,
    reason           text        NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
    republished_at   timestamptz,
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX dead_letter_log_open ON dead_letter_log (consumer_group) WHERE republished_at IS NULL;
