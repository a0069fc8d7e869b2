//! docs/conformance.md#lifecycle complete, for a batch
//! ([`WorkerStore::complete_tasks`](crate::WorkerStore::complete_tasks)): what both
//! backends' batched completions share, written once ([`complete_batch`]) — the items
//! checked and laid out as columns before the write ([`Prepared::of`]), the terminal move
//! of the rows the write moved ([`settle_moved`]) and each item's answer after it
//! ([`Moved`]). Each backend writes the batch with its own statement
//! ([`BatchCompletion::write`]): PostgreSQL binds the columns as arrays, SQLite as one
//! JSON list.

use super::attempts::Ending;
use super::cost::{SettleRow, encode_reservation};
use super::rows::{CompletedRow, FinishedRow, encode_completion, tasks};
use super::terminal::{Returned, TerminalMove, TerminalStatements, Wake, after_terminal_with};
use crate::{Completion, StoreResult, Transition};
use std::collections::{HashMap, HashSet};
use tollgate_core::attempt::settle_charged;
use tollgate_core::{RunId, Task, TaskId, Timestamp};

/// What a backend supplies to [`complete_batch`].
#[async_trait::async_trait]
pub(crate) trait BatchCompletion: Sync {
    /// The tasks of these ids that exist, by id (no statement for none), read outside
    /// the write.
    async fn tasks_by_id(&self, ids: &[String]) -> StoreResult<HashMap<TaskId, Task>>;
    /// Writes a prepared batch (at least one item) with its terminal move: the rows it
    /// moved, as they are now, and the runs it woke.
    async fn write(&self, prepared: &Prepared) -> StoreResult<(Vec<CompletedRow>, Vec<RunId>)>;
}

/// [`WorkerStore::complete_tasks`](crate::WorkerStore::complete_tasks): each item checked
/// before the write ([`Prepared::of`], against the worker's copy or the row read first),
/// the ones that may apply written together ([`BatchCompletion::write`]), then each item
/// answered, a refused one with its task as it is now (only those are read).
pub(crate) async fn complete_batch<B: BatchCompletion>(
    store: &B,
    items: Vec<Completion>,
) -> StoreResult<Vec<StoreResult<Transition>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let read = store.tasks_by_id(&unknown(&items)).await?;
    let prepared = Prepared::of(&items, &read)?;
    let (done, woken_runs) = if prepared.batch.ids.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        store.write(&prepared).await?
    };
    let moved = Moved::of(done)?;
    let read = store
        .tasks_by_id(&moved.refused(&items, &prepared.answers))
        .await?;
    Ok(moved.answers(&items, prepared.answers, read, woken_runs))
}

/// The worker's claimed copy of an item's task, when it has one of that task.
fn claimed_copy(item: &Completion) -> Option<&Task> {
    item.claimed.as_deref().filter(|t| t.id == item.id)
}

/// The ids of the items without a claimed copy: their rows are read before the write.
fn unknown(items: &[Completion]) -> Vec<String> {
    items
        .iter()
        .filter(|item| claimed_copy(item).is_none())
        .map(|item| item.id.to_string())
        .collect()
}

/// The columns of a completion batch's items, one entry per item that may apply.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) ids: Vec<String>,
    pub(crate) workers: Vec<String>,
    pub(crate) outputs: Vec<String>,
    pub(crate) usages: Vec<String>,
    /// Each item's attempt ends with it (`END_ATTEMPT`'s columns, for a batch).
    pub(crate) attempt_usages: Vec<Option<String>>,
    pub(crate) charged_nano: Vec<i64>,
    pub(crate) charged_tokens: Vec<i64>,
    /// The claim each item completes under (its lease's).
    pub(crate) claims: Vec<i64>,
    /// What each reserved task is charged if the completion's attempt is its only one
    /// (the common case), written by the move itself; the settlement checks it against
    /// the attempts the move returns ([`Returned`]).
    pub(crate) guess_nano: Vec<Option<i64>>,
    pub(crate) guess_tokens: Vec<Option<i64>>,
    /// Each task's reservation as stored.
    pub(crate) guess_reservations: Vec<Option<String>>,
}

impl Batch {
    /// The charges the move writes: each reserved task's guess.
    pub(crate) fn written(&self) -> HashSet<(String, i64, i64)> {
        self.ids
            .iter()
            .zip(self.guess_nano.iter().zip(&self.guess_tokens))
            .filter_map(|(id, guess)| match guess {
                (Some(n), Some(t)) => Some((id.clone(), *n, *t)),
                _ => None,
            })
            .collect()
    }
}

/// A batch checked before its write.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) batch: Batch,
    /// Each item's answer when it is known before the write: its task is gone, it names
    /// a task already in the batch, or its output breaks the task's contract.
    pub(crate) answers: Vec<Option<StoreResult<Transition>>>,
    /// Whether a task of the batch belongs to a run (runs may wait on it).
    pub(crate) any_run: bool,
    /// A lone completion's settlement as it will be if its attempt ending now is its
    /// only one; `None` for a batch of several, or once the item has a source, which the
    /// guess does not cover (docs/locking.md, "Completions in one statement").
    pub(crate) guessed: Option<Vec<SettleRow>>,
}

impl Prepared {
    /// Checks each item as [`complete_task`](crate::WorkerStore::complete_task) checks
    /// it — the request never changes, so its contract is checked before the write:
    /// against the worker's claimed copy when it has one, else against `read` — and lays
    /// out the ones that may apply.
    fn of(items: &[Completion], read: &HashMap<TaskId, Task>) -> StoreResult<Prepared> {
        let mut answers: Vec<Option<StoreResult<Transition>>> =
            items.iter().map(|_| None).collect();
        let mut batch = Batch::default();
        let mut seen = HashSet::new();
        let mut any_run = false;
        let mut guessed: Option<Vec<SettleRow>> = (items.len() == 1).then(Vec::new);
        for (i, item) in items.iter().enumerate() {
            let Some(task) = claimed_copy(item).or_else(|| read.get(&item.id)) else {
                answers[i] = Some(Ok(Transition::default()));
                continue;
            };
            if !seen.insert(item.id) {
                // The same task twice: only its first completion can apply.
                answers[i] = Some(Ok(Transition::default()));
                continue;
            }
            let encoded = encode_completion(task, &item.output, &item.usage).and_then(|e| {
                let ending = Ending::of_completion(task, &item.usage, item.attempt.as_ref())?;
                Ok((e, ending))
            });
            let ((output, usage), ending) = match encoded {
                Ok(encoded) => encoded,
                Err(e) if e.is_per_item() => {
                    answers[i] = Some(Err(e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            any_run |= task.run_id().is_some();
            let charged_tokens = i64::try_from(ending.charged.tokens).unwrap_or(i64::MAX);
            batch.ids.push(item.id.to_string());
            batch.workers.push(item.lease.worker.as_str().to_string());
            batch.outputs.push(output);
            batch.usages.push(usage);
            batch.attempt_usages.push(ending.usage);
            batch.charged_nano.push(ending.charged.nano_usd);
            batch.charged_tokens.push(charged_tokens);
            batch.claims.push(i64::from(item.lease.claim));
            let guess = task.reservation.map(|r| settle_charged(&r, ending.charged));
            batch.guess_nano.push(guess.map(|c| c.nano_usd));
            batch
                .guess_tokens
                .push(guess.map(|c| i64::try_from(c.tokens).unwrap_or(i64::MAX)));
            let reservation = task
                .reservation
                .as_ref()
                .map(encode_reservation)
                .transpose()?;
            if task.source.is_some() {
                guessed = None;
            }
            if let (Some(rows), Some(r)) = (guessed.as_mut(), &reservation) {
                rows.push(SettleRow {
                    id: item.id.to_string(),
                    app: task.app.as_str().to_string(),
                    scope: task.scope.as_str().to_string(),
                    created_at: task.created_at.0,
                    claimed_at: task.claimed_at.map(|t| t.0),
                    reservation: r.clone(),
                    usage: None,
                    attempts: 1,
                    attempts_nano: ending.charged.nano_usd,
                    attempts_tokens: charged_tokens,
                });
            }
            batch.guess_reservations.push(reservation);
        }
        Ok(Prepared {
            batch,
            answers,
            any_run,
            guessed,
        })
    }
}

/// The terminal move of the rows a batch's statement moved, in its transaction
/// ([`after_terminal_with`], with what the statement returned): only run-owned tasks can
/// have waiting runs, so the wake (and the attempts it would end, ended by the move
/// already) is skipped otherwise. Returns the woken runs.
pub(crate) async fn settle_moved<S: TerminalStatements + ?Sized>(
    tx: &mut S,
    done: &[CompletedRow],
    batch: &Batch,
    any_run: bool,
) -> StoreResult<Vec<RunId>> {
    let now = done.first().map_or(Timestamp(0), |d| Timestamp(d.now));
    let finished: Vec<FinishedRow> = done.iter().map(CompletedRow::finished).collect();
    let plan = if any_run {
        TerminalMove::SUCCEEDED
    } else {
        TerminalMove {
            wake: Wake::No,
            ..TerminalMove::SUCCEEDED
        }
    };
    let returned = Returned {
        rows: done.iter().filter_map(CompletedRow::settle_row).collect(),
        written: batch.written(),
        listened: Some(done.iter().any(|d| d.listened)),
    };
    after_terminal_with(tx, &finished, plan, now, returned).await
}

/// The tasks a batch moved, as they are now.
struct Moved {
    after: HashMap<TaskId, Task>,
    applied: HashSet<TaskId>,
}

impl Moved {
    /// The rows the batch's statement moved.
    fn of(done: Vec<CompletedRow>) -> StoreResult<Moved> {
        let after: HashMap<TaskId, Task> = tasks(done.into_iter().map(|d| d.task).collect())?
            .into_iter()
            .map(|t| (t.id, t))
            .collect();
        let applied = after.keys().copied().collect();
        Ok(Moved { after, applied })
    }

    /// The ids of the items refused by the write (not moved, not answered before it): a
    /// refused item is answered with its task as it is now, so only these are read.
    fn refused(
        &self,
        items: &[Completion],
        answers: &[Option<StoreResult<Transition>>],
    ) -> Vec<String> {
        items
            .iter()
            .zip(answers)
            .filter(|(item, answer)| {
                !self.applied.contains(&item.id) && !matches!(answer, Some(Err(_)))
            })
            .map(|(item, _)| item.id.to_string())
            .collect()
    }

    /// Each item's answer, with `read` the refused items' tasks. Runs woken by the batch
    /// are reported on its first applied transition (wakes are notification hints; the
    /// database holds the truth).
    fn answers(
        mut self,
        items: &[Completion],
        answers: Vec<Option<StoreResult<Transition>>>,
        read: HashMap<TaskId, Task>,
        mut woken_runs: Vec<RunId>,
    ) -> Vec<StoreResult<Transition>> {
        self.after.extend(read);
        let mut answered = HashSet::new();
        items
            .iter()
            .zip(answers)
            .map(|(item, answer)| match answer {
                Some(Err(e)) => Err(e),
                _ if self.applied.contains(&item.id) && answered.insert(item.id) => {
                    Ok(Transition {
                        applied: true,
                        task: self.after.get(&item.id).cloned(),
                        woken_runs: std::mem::take(&mut woken_runs),
                    })
                }
                _ => Ok(Transition {
                    applied: false,
                    task: self.after.get(&item.id).cloned(),
                    woken_runs: Vec::new(),
                }),
            })
            .collect()
    }
}
