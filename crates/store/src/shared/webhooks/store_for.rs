//! The one line each backend states [`WebhookStore`](crate::WebhookStore) with.

/// [`WebhookStore`](crate::WebhookStore) for a backend (written once; each backend states
/// it with one line).
macro_rules! webhook_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::WebhookStore for $store {
            async fn create_webhook_endpoint(
                &self,
                new: $crate::webhooks::NewWebhookEndpoint,
            ) -> $crate::StoreResult<$crate::webhooks::WebhookEndpoint> {
                $crate::shared::webhooks::Webhooks::create_endpoint(self, new).await
            }
            async fn list_webhook_endpoints(
                &self,
                app: &tollgate_core::AppId,
            ) -> $crate::StoreResult<Vec<$crate::webhooks::WebhookEndpoint>> {
                $crate::shared::webhooks::Webhooks::list_endpoints(self, app).await
            }
            async fn get_webhook_endpoint(
                &self,
                app: &tollgate_core::AppId,
                id: &str,
            ) -> $crate::StoreResult<Option<$crate::webhooks::WebhookEndpoint>> {
                $crate::shared::webhooks::Webhooks::get_endpoint(self, app, id).await
            }
            async fn update_webhook_endpoint(
                &self,
                app: &tollgate_core::AppId,
                id: &str,
                patch: $crate::webhooks::WebhookEndpointPatch,
            ) -> $crate::StoreResult<Option<$crate::webhooks::WebhookEndpoint>> {
                $crate::shared::webhooks::Webhooks::update_endpoint(self, app, id, patch).await
            }
            async fn delete_webhook_endpoint(
                &self,
                app: &tollgate_core::AppId,
                id: &str,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::webhooks::Webhooks::delete_endpoint(self, app, id).await
            }
            async fn sync_config_webhook_endpoints(
                &self,
                endpoints: Vec<$crate::webhooks::NewWebhookEndpoint>,
            ) -> $crate::StoreResult<()> {
                $crate::shared::webhooks::Webhooks::sync_config(self, endpoints).await
            }
            async fn list_webhook_events(
                &self,
                app: &tollgate_core::AppId,
                limit: u32,
            ) -> $crate::StoreResult<Vec<tollgate_core::webhook::WebhookEvent>> {
                $crate::shared::webhooks::Webhooks::list_events(self, app, limit).await
            }
            async fn list_webhook_deliveries(
                &self,
                app: &tollgate_core::AppId,
                query: &$crate::webhooks::DeliveryQuery,
            ) -> $crate::StoreResult<Vec<$crate::webhooks::WebhookDelivery>> {
                $crate::shared::webhooks::Webhooks::list_deliveries(self, app, query).await
            }
            async fn replay_webhook_delivery(
                &self,
                app: &tollgate_core::AppId,
                id: &str,
            ) -> $crate::StoreResult<Option<$crate::webhooks::WebhookDelivery>> {
                $crate::shared::webhooks::Webhooks::replay(self, app, id).await
            }
            async fn lease_webhook_deliveries(
                &self,
                worker: &tollgate_core::WorkerId,
                lease: std::time::Duration,
                limit: u32,
                per_app: u32,
                skip_apps: &[tollgate_core::AppId],
            ) -> $crate::StoreResult<Vec<$crate::webhooks::LeasedDelivery>> {
                $crate::shared::webhooks::Webhooks::lease(
                    self, worker, lease, limit, per_app, skip_apps,
                )
                .await
            }
            async fn record_webhook_attempt(
                &self,
                id: &str,
                worker: &tollgate_core::WorkerId,
                result: $crate::webhooks::AttemptResult,
                schedule: &tollgate_core::webhook::RetrySchedule,
                random: f64,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::webhooks::Webhooks::record_attempt(
                    self, id, worker, result, schedule, random,
                )
                .await
            }
            async fn release_webhook_delivery(
                &self,
                id: &str,
                worker: &tollgate_core::WorkerId,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::webhooks::Webhooks::release(self, id, worker).await
            }
        }
    };
}
pub(crate) use webhook_store_for;
