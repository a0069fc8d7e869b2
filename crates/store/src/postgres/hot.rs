//! Connections for lone statements, kept beside the pool (docs/locking.md, "Connections
//! for lone statements").
//!
//! sqlx pings every connection as it goes back to its pool: one more round trip per use,
//! off the caller's path but waking the database's backend and this process each time
//! (for a lone creation or completion, one statement, that doubles the messages). The
//! statements that make a task's whole write on their own — a creation or a completion
//! in one statement — run on one of a few connections taken out of the pool
//! ([`sqlx::pool::PoolConnection::detach`]) and kept here between uses instead: a
//! statement that ran to its end (its answer read, an error answered by the server
//! included) leaves its connection ready for the next, so nothing needs checking. One
//! that did not (its caller went away mid-statement, or the connection failed) is closed,
//! not kept. One idle for a while is pinged before its next use, as the pool's are. When
//! every kept connection is in use, the statement takes one from the pool as before.
//!
//! At most [`HotConnections::cap`] connections are kept, in addition to the pool's
//! `max_connections` (docs/operations: README "PostgreSQL").

use crate::{StoreError, StoreResult};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The kept connections of one store.
#[derive(Debug)]
pub(super) struct HotConnections {
    pool: PgPool,
    cap: usize,
    /// A kept connection idle this long is pinged before use, as the pool's are (the
    /// server or the network may have closed it meanwhile).
    ping_after: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Kept connections not in use, each with when it was last given back.
    idle: Vec<(PgConnection, Instant)>,
    /// Kept connections, idle or in use.
    live: usize,
    /// Whether the store closed: nothing is kept any more.
    closed: bool,
}

/// A connection for one lone statement: a kept one, or the pool's.
pub(super) enum Lone<'a> {
    Kept(Kept<'a>),
    Pooled(PoolConnection<Postgres>),
}

/// A kept connection in use; [`Lone::done`] keeps it again, dropping it closes it.
pub(super) struct Kept<'a> {
    conn: Option<PgConnection>,
    hot: &'a HotConnections,
}

impl HotConnections {
    /// Keeps up to `cap` connections of `pool` (0: none, every statement uses the pool),
    /// pinging one idle for `ping_after` or longer before its next use.
    pub(super) fn new(pool: PgPool, cap: usize, ping_after: Duration) -> HotConnections {
        HotConnections {
            pool,
            cap,
            ping_after,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection for one statement: an idle kept one, a new kept one while fewer than
    /// the cap live, else the pool's.
    pub(super) async fn lone(&self) -> StoreResult<Lone<'_>> {
        while let Some((conn, since)) = self.pop_idle() {
            let mut lone = Lone::Kept(Kept {
                conn: Some(conn),
                hot: self,
            });
            if since.elapsed() < self.ping_after
                || sqlx::Connection::ping(lone.conn()).await.is_ok()
            {
                return Ok(lone);
            }
            // Dropped: closed, and no longer counted.
        }
        let take_new = {
            let mut state = self.lock();
            let grow = !state.closed && state.live < self.cap;
            if grow {
                state.live += 1;
            }
            grow
        };
        let pooled = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                if take_new {
                    self.lock().live -= 1;
                }
                return Err(e.into());
            }
        };
        if !take_new {
            return Ok(Lone::Pooled(pooled));
        }
        Ok(Lone::Kept(Kept {
            conn: Some(pooled.detach()),
            hot: self,
        }))
    }

    /// The kept connection given back last, if one is idle.
    fn pop_idle(&self) -> Option<(PgConnection, Instant)> {
        self.lock().idle.pop()
    }

    /// Closes the kept connections; none is kept from now on.
    pub(super) async fn close(&self) {
        let idle = {
            let mut state = self.lock();
            state.closed = true;
            state.live -= state.idle.len();
            std::mem::take(&mut state.idle)
        };
        for (conn, _) in idle {
            // Closing is a courtesy to the server; a failure changes nothing here.
            let _ = sqlx::Connection::close(conn).await;
        }
    }

    /// Kept connections (idle or in use), for diagnostics and tests.
    pub(super) fn live(&self) -> usize {
        self.lock().live
    }
}

impl Lone<'_> {
    /// The connection.
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        match self {
            Lone::Kept(kept) => kept
                .conn
                .as_mut()
                .expect("a kept connection is present until it is given back"),
            Lone::Pooled(pooled) => pooled,
        }
    }

    /// The statement ran to its end with `result`: a kept connection is kept again unless
    /// the connection may have failed (an error the server did not answer, or one it
    /// answers when it ends the session, all [`StoreError::Unavailable`]); a pooled one
    /// goes back to the pool (which checks it).
    pub(super) fn done<T>(self, result: &StoreResult<T>) {
        self.given_back(!matches!(result, Err(StoreError::Unavailable(_))));
    }

    /// [`Lone::done`] for a statement run by sqlx itself: kept again after its answer,
    /// whether rows or an error the server answered.
    pub(super) fn done_sqlx<T>(self, result: &Result<T, sqlx::Error>) {
        self.given_back(matches!(result, Ok(_) | Err(sqlx::Error::Database(_))));
    }

    fn given_back(self, reusable: bool) {
        let Lone::Kept(mut kept) = self else {
            return;
        };
        if !reusable {
            return;
        }
        let Some(conn) = kept.conn.take() else {
            return;
        };
        let mut state = kept.hot.lock();
        if state.closed {
            state.live -= 1;
            return;
        }
        state.idle.push((conn, Instant::now()));
    }
}

impl Drop for Kept<'_> {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            // Not given back: the statement did not run to its end, or the connection
            // failed. It is closed (dropped) and another may be kept in its place.
            self.hot.lock().live -= 1;
        }
    }
}
