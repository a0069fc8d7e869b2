-- Issue 32: a completion batch in one statement when the worker's guess of its
-- settlement holds (docs/locking.md, "Completions in one statement").
--
-- A completion of tasks without an admission and outside a run writes, besides the task
-- rows and their attempts, only its settlement's spend buckets (and, when someone
-- listens, outbox rows). The worker knows what that settlement will be when each task's
-- attempt ending now is its only one, which is the common case; the store then writes
-- the rows and the buckets in one statement, without a transaction of its own. This
-- function is the statement's check that the guess held: called on each row the
-- statement moved (and once on the count of rows moved), it fails the whole statement
-- when the guess did not hold, so nothing of it is written, and the store records the
-- batch as before (its own transaction, the settlement planned from what the rows say).
-- p_code says why: 'TGG01' someone listens for the batch's events (which lasts),
-- 'TGG02' the rows are not as guessed (a task canceled meanwhile, or one that made
-- more than one attempt).
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
