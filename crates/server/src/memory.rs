//! Giving freed memory back to the system after a large request (docs/api.md,
//! "Batches"): glibc's allocator keeps what a request freed in its arenas, so without this
//! the process's resident memory stays at its peak after a large batch.

/// Returns the allocator's free pages to the system (glibc only; elsewhere nothing to do).
pub(crate) fn give_back_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases memory no allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
}
