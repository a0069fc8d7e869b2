//! Parsed pipeline definitions kept per process, and loading a run's pipeline through
//! them: the facade (registering, starting, reading runs) and the driver both load here.

use crate::error::EngineError;
use crate::inner::Inner;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tollgate_core::pipeline::Pipeline;
use tollgate_core::{AppId, InvalidInput};
use tollgate_store::{PipelineRef, StoredPipeline};

/// Parsed definitions kept per process; beyond this many the cache starts afresh.
const CACHE_CAPACITY: usize = 256;

/// Parsed definitions by version (a version is the hash of its definition, so one
/// version always parses to the same pipeline, whichever app registered it).
#[derive(Debug, Default)]
pub(crate) struct PipelineCache(Mutex<HashMap<String, Arc<Pipeline>>>);

impl PipelineCache {
    pub(crate) fn get(&self, version: &str) -> Option<Arc<Pipeline>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(version)
            .cloned()
    }

    pub(crate) fn insert(&self, pipeline: Arc<Pipeline>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= CACHE_CAPACITY {
            map.clear();
        }
        map.insert(pipeline.version.clone(), pipeline);
    }
}

/// The pipeline version a run runs, from the cache or the store. `None`: the app has no
/// such version. A stored definition that no longer parses is [`EngineError::Invalid`].
pub(crate) async fn load_pipeline(
    inner: &Inner,
    app: &AppId,
    pipeline: &PipelineRef,
) -> Result<Option<Arc<Pipeline>>, EngineError> {
    if let Some(p) = inner.pipelines.get(&pipeline.version) {
        return Ok(Some(p));
    }
    let Some(stored) = inner
        .store
        .get_pipeline(app, &pipeline.name, Some(&pipeline.version))
        .await?
    else {
        return Ok(None);
    };
    parsed(inner, &stored).map(Some)
}

/// Parses a stored definition (through the cache).
pub(crate) fn parsed(inner: &Inner, stored: &StoredPipeline) -> Result<Arc<Pipeline>, EngineError> {
    if let Some(p) = inner.pipelines.get(&stored.version) {
        return Ok(p);
    }
    let pipeline = Arc::new(Pipeline::parse(&stored.definition)?);
    if pipeline.version != stored.version {
        return Err(InvalidInput::field(
            "definition",
            format!(
                "the stored definition of {} hashes to {}, not to its version {}",
                stored.name, pipeline.version, stored.version
            ),
        )
        .into());
    }
    inner.pipelines.insert(pipeline.clone());
    Ok(pipeline)
}
