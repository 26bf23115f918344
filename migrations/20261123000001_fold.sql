-- projectionist_fold(v ORDER BY n): ((v1 + v2) + v3) + …, in the values' own type and
-- arithmetic (NULL absorbs, overflow is an error, each step as an UPDATE per event would).
-- A batch adds an event chain's deltas to a column with it, so the result never depends on
-- where batches are cut. The state is a one-element array, to tell "nothing yet" from NULL.
CREATE OR REPLACE FUNCTION projectionist_fold_step(state anyarray, value anyelement) RETURNS anyarray
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN state IS NULL THEN ARRAY[value] ELSE ARRAY[state[1] + value] END $$;

CREATE OR REPLACE FUNCTION projectionist_fold_final(state anyarray) RETURNS anyelement
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT state[1] $$;

CREATE OR REPLACE AGGREGATE projectionist_fold(anyelement) (
    SFUNC = projectionist_fold_step,
    STYPE = anyarray,
    FINALFUNC = projectionist_fold_final
);
