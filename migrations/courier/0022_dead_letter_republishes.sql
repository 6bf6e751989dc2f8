-- Every dead letter an operator sent back to its topic (`courier dlq republish`, the console's
-- Republish): which message, why it had died, who sent it back and why. The audit the other
-- operator actions have (outbox_operator_actions, parked_key_releases, consumer_offset_resets);
-- dead_letter_log only closed the letter.
CREATE TABLE dead_letter_republishes (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription     text        NOT NULL,
    -- The original message's id ('' when the dead letter does not carry it).
    message_id       text        NOT NULL,
    event_id         text,
    ordering_key     text        NOT NULL,
    -- Why it had been dead-lettered.
    dead_reason      text,
    republished_by   text        NOT NULL,
    reason           text        NOT NULL,
    republished_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letter_republishes_at ON dead_letter_republishes (republished_at);
