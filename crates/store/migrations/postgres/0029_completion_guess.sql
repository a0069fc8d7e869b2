-- Issue 32: a completion in one statement when the worker's guess of its settlement
-- holds (docs/locking.md, "Completions in one statement").
--
-- A completion of a task without an admission and outside a run writes, besides the task
-- row and its attempt, only its settlement (the spend buckets, the token refund) and,
-- when someone listens, an outbox row. The worker knows what that settlement will be
-- when the attempt ending now is the task's only one, which is the common case; the
-- store then writes the row and the settlement in one statement, without a transaction
-- of its own. This function is the statement's check that the guess held: called on
-- what the statement moved, it fails the whole statement when the guess did not hold,
-- so nothing of it is written, and the store records the completion as before (its own
-- transaction, the settlement planned from what the row says). p_code says why:
-- 'TGG01' someone listens for the events (which lasts), 'TGG02' the rows are not as
-- guessed (a task canceled meanwhile, or one that made more than one attempt).
CREATE FUNCTION tollgate_guess_holds(p_holds BOOLEAN, p_code TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_holds IS NOT TRUE THEN
        RAISE EXCEPTION 'the completion''s settlement differs from its guess'
            USING ERRCODE = p_code;
    END IF;
    RETURN TRUE;
END
$$;
