//! What the engine shares between the facade, the workers, the sweeper and the pipeline
//! driver: one [`Inner`] per engine, built by [`TollgateBuilder`](crate::TollgateBuilder)
//! and held behind an `Arc`. The facade builds it; the parts that run (workers, sweeper,
//! driver) only read it, so none of them depends on the facade that starts them.

use crate::config::EngineConfig;
use crate::notify::{Event, FinishedTask, Notifier};
use crate::pipeline_cache::PipelineCache;
use crate::provider::ProviderRegistry;
use crate::registry::{BudgetPolicies, ModelRegistry};
use crate::watch::Watches;
use serde_json::Value;
use std::sync::Arc;
use tollgate_core::{InvalidInput, TaskKind, ValidatedRequest, check_output_fits};
use tollgate_store::{Store, Transition};

/// What the engine shares between the facade, the workers and the sweeper.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: EngineConfig,
    pub(crate) models: ModelRegistry,
    pub(crate) budgets: BudgetPolicies,
    pub(crate) providers: ProviderRegistry,
    pub(crate) notifier: Notifier,
    pub(crate) pipelines: PipelineCache,
    /// Shared watches of waited-on tasks and each app's waiter slots.
    pub(crate) watches: Arc<Watches>,
    /// Live output of the tasks this process executes (docs/api.md, "Streaming a task").
    pub(crate) streams: Arc<crate::stream::StreamHub>,
    /// Traces (docs/telemetry.md): off unless a tracer was given.
    pub(crate) traces: crate::telemetry::Traces,
    /// This process's worker pool while it runs (docs/engine.md, "Door calls claimed at
    /// creation"): a door call may be created already claimed by it.
    pub(crate) local_pool: std::sync::Mutex<std::sync::Weak<crate::worker::WorkerPool>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("store", &self.store.backend())
            .field("models", &self.models)
            .field("notifier", &self.notifier)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// A free execution slot of this process's running worker pool for a door call's
    /// task, created already claimed (docs/engine.md, "Tasks claimed at creation");
    /// `None` when no pool runs here or it should not take one now.
    pub(crate) fn direct_slot(&self) -> Option<crate::worker::DirectSlot> {
        let pool = self
            .local_pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .upgrade()?;
        pool.direct_slot()
    }

    /// A door call's task is about to be created claimed by this process: the provider of
    /// its model's deployment gets ready for the call beside the creation (an unpaced HTTP
    /// provider begins its pause read, docs/engine.md, "Provider pace"). A route of
    /// several deployments reads its cooldowns first and picks one then: nothing ahead.
    pub(crate) fn prepare_call(&self, model: &tollgate_core::ModelId) {
        let Ok(model) = self.models.resolve(Some(model)) else {
            return;
        };
        if let [deployment] = model.route.deployments.as_slice()
            && let Some(provider) = self.providers.get(&deployment.provider)
        {
            provider.prepare();
        }
    }

    /// docs/conformance.md#create-validate for a request: valid for its kind, within the request size limit,
    /// and able to produce an output within the output limit. The one check every
    /// submission (and every pipeline step written in full) goes through.
    pub(crate) fn validate_request(
        &self,
        kind: TaskKind,
        raw: &Value,
    ) -> Result<ValidatedRequest, InvalidInput> {
        let request = ValidatedRequest::new(kind, raw, self.config.max_request_bytes)?;
        check_output_fits(request.request(), self.config.max_output_bytes)?;
        Ok(request)
    }

    /// Notifies about a state change that took effect: the task's app and the runs woken.
    pub(crate) fn publish_transition(&self, transition: &Transition) {
        if !transition.applied {
            return;
        }
        let app = transition.task.as_ref().map(|t| t.app.clone());
        if let Some(task) = &transition.task {
            let task = Arc::new(task.clone());
            // This process's waiters on the task hear its end at once, not through the
            // watches' loop (one hand-over fewer, docs/api.md, "Waiting").
            self.watches.ended(&task);
            self.notifier.publish(Event::TaskFinished {
                app: Some(task.app.clone()),
                id: task.id,
                status: Some(task.status),
                task: Some(FinishedTask(task)),
            });
        }
        for run in &transition.woken_runs {
            self.notifier.publish(Event::RunWoken {
                app: app.clone(),
                id: *run,
            });
        }
    }
}
