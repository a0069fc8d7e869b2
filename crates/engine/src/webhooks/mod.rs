//! Webhooks (docs/webhooks.md): an app's endpoints managed through its [`CallerView`]
//! (the configuration file's are written to the store at start and are read-only), and
//! the delivery loop every replica runs ([`deliver`]).

mod deliver;
mod http;

pub(crate) use deliver::run;

use crate::access::CallerView;
use crate::config::WebhookConfig;
use crate::error::EngineError;
use crate::inner::Inner;
use std::net::IpAddr;
use tollgate_core::webhook::budget::{BudgetThreshold, check_thresholds};
use tollgate_core::webhook::{
    WebhookEventType, WebhookSecret, address_allowed, check_endpoint_url,
};
use tollgate_core::{AppId, InvalidInput};
use tollgate_store::webhooks::{
    DeliveryQuery, NewWebhookEndpoint, WebhookDelivery, WebhookEndpoint, WebhookEndpointPatch,
};

/// Longest endpoint description.
const MAX_DESCRIPTION_CHARS: usize = 500;

/// A new endpoint as a caller asks for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebhookInput {
    /// Where deliveries go (`https`, unless the operator allows `http`).
    pub url: String,
    /// The event types it receives (at least one).
    pub events: Vec<WebhookEventType>,
    /// The shares of a USD limit it hears `budget.threshold` about (default
    /// [`BudgetThreshold::DEFAULT`], 0.8).
    pub budget_thresholds: Option<Vec<BudgetThreshold>>,
    /// Free text.
    pub description: Option<String>,
    /// Whether it receives deliveries (default true).
    pub enabled: Option<bool>,
    /// The signing secret, `whsec_<base64>`; one is made when `None`.
    pub secret: Option<String>,
}

/// A change to an endpoint: each `Some` replaces that field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebhookChange {
    /// New url.
    pub url: Option<String>,
    /// New event types.
    pub events: Option<Vec<WebhookEventType>>,
    /// New budget thresholds.
    pub budget_thresholds: Option<Vec<BudgetThreshold>>,
    /// New description (`Some(None)` clears it).
    pub description: Option<Option<String>>,
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// New secret (`whsec_<base64>`).
    pub secret: Option<String>,
}

/// docs/webhooks.md, "Addresses": the URL's scheme (https unless `allow_http`), and an
/// address written in it must be one endpoints may reach. Names are checked on every
/// delivery, after they resolve.
pub(crate) fn check_url(config: &WebhookConfig, url: &str) -> Result<(), InvalidInput> {
    let (host, _) = check_endpoint_url(url, config.allow_http)?;
    if let Ok(ip) = host.parse::<IpAddr>()
        && !address_allowed(ip, &config.networks())
    {
        return Err(InvalidInput::field(
            "url",
            format!(
                "{ip} is a loopback, private, link-local or other internal address; webhooks \
                 may reach it only inside [webhooks] allowed_networks"
            ),
        ));
    }
    Ok(())
}

fn check_description(d: &Option<String>) -> Result<(), InvalidInput> {
    match d {
        Some(d) if d.chars().count() > MAX_DESCRIPTION_CHARS => Err(InvalidInput::field(
            "description",
            format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
        )),
        _ => Ok(()),
    }
}

fn check_events(events: &[WebhookEventType]) -> Result<(), InvalidInput> {
    tollgate_core::webhook::subscription_text(events).map(|_| ())
}

/// A new random secret: 32 bytes from the operating system's generator.
fn new_secret() -> Result<String, InvalidInput> {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    Ok(WebhookSecret::from_bytes(bytes)?.to_text())
}

impl CallerView {
    fn webhooks_allowed(&self) -> Result<(), EngineError> {
        self.no_subject(
            "webhooks belong to the whole app; a key bound to a subject cannot manage them",
        )
    }

    fn editable(&self, endpoint: &WebhookEndpoint) -> Result<(), EngineError> {
        if endpoint.from_config {
            return Err(EngineError::InvalidState(format!(
                "webhook {} comes from the configuration file; change it there",
                endpoint.id
            )));
        }
        Ok(())
    }

    /// Creates an endpoint of the caller's app.
    pub async fn create_webhook(
        &self,
        input: WebhookInput,
    ) -> Result<WebhookEndpoint, EngineError> {
        self.webhooks_allowed()?;
        let config = &self.tollgate().inner.config.webhooks;
        check_url(config, &input.url)?;
        check_events(&input.events)?;
        check_description(&input.description)?;
        let budget_thresholds = match &input.budget_thresholds {
            Some(t) => check_thresholds(t)?,
            None => vec![BudgetThreshold::DEFAULT],
        };
        let secret = match input.secret {
            Some(s) => WebhookSecret::parse(&s)?.to_text(),
            None => new_secret()?,
        };
        Ok(self
            .tollgate()
            .inner
            .store
            .create_webhook_endpoint(NewWebhookEndpoint {
                id: format!("whe_{}", uuid::Uuid::now_v7().simple()),
                app: self.app().clone(),
                url: input.url,
                secret,
                events: input.events,
                budget_thresholds,
                enabled: input.enabled.unwrap_or(true),
                description: input.description,
                from_config: false,
            })
            .await?)
    }

    /// The app's endpoints, oldest first.
    pub async fn list_webhooks(&self) -> Result<Vec<WebhookEndpoint>, EngineError> {
        self.webhooks_allowed()?;
        Ok(self
            .tollgate()
            .inner
            .store
            .list_webhook_endpoints(self.app())
            .await?)
    }

    /// One endpoint of the app.
    pub async fn get_webhook(&self, id: &str) -> Result<Option<WebhookEndpoint>, EngineError> {
        self.webhooks_allowed()?;
        Ok(self
            .tollgate()
            .inner
            .store
            .get_webhook_endpoint(self.app(), id)
            .await?)
    }

    /// Changes an endpoint made over the API; `None` when the app has none of that id.
    pub async fn update_webhook(
        &self,
        id: &str,
        change: WebhookChange,
    ) -> Result<Option<WebhookEndpoint>, EngineError> {
        let Some(current) = self.get_webhook(id).await? else {
            return Ok(None);
        };
        self.editable(&current)?;
        let config = &self.tollgate().inner.config.webhooks;
        if let Some(url) = &change.url {
            check_url(config, url)?;
        }
        if let Some(events) = &change.events {
            check_events(events)?;
        }
        if let Some(d) = &change.description {
            check_description(d)?;
        }
        let budget_thresholds = change
            .budget_thresholds
            .as_deref()
            .map(check_thresholds)
            .transpose()?;
        let secret = change
            .secret
            .map(|s| WebhookSecret::parse(&s).map(|s| s.to_text()))
            .transpose()?;
        Ok(self
            .tollgate()
            .inner
            .store
            .update_webhook_endpoint(
                self.app(),
                id,
                WebhookEndpointPatch {
                    url: change.url,
                    secret,
                    events: change.events,
                    budget_thresholds,
                    enabled: change.enabled,
                    description: change.description,
                },
            )
            .await?)
    }

    /// Deletes an endpoint made over the API, with its deliveries; false when the app has
    /// none of that id.
    pub async fn delete_webhook(&self, id: &str) -> Result<bool, EngineError> {
        let Some(current) = self.get_webhook(id).await? else {
            return Ok(false);
        };
        self.editable(&current)?;
        Ok(self
            .tollgate()
            .inner
            .store
            .delete_webhook_endpoint(self.app(), id)
            .await?)
    }

    /// The app's deliveries, newest first (of one endpoint, event or state when the query
    /// says so).
    pub async fn webhook_deliveries(
        &self,
        query: &DeliveryQuery,
    ) -> Result<Vec<WebhookDelivery>, EngineError> {
        self.webhooks_allowed()?;
        Ok(self
            .tollgate()
            .inner
            .store
            .list_webhook_deliveries(self.app(), query)
            .await?)
    }

    /// Sends a delivery again (same event, same `webhook-id`); `None` when the app has no
    /// such delivery.
    pub async fn replay_webhook_delivery(
        &self,
        id: &str,
    ) -> Result<Option<WebhookDelivery>, EngineError> {
        self.webhooks_allowed()?;
        Ok(self
            .tollgate()
            .inner
            .store
            .replay_webhook_delivery(self.app(), id)
            .await?)
    }
}

/// Writes the configuration file's endpoints to the store (replacing the previous
/// configuration's), at start.
pub(crate) async fn sync_config_endpoints(inner: &Inner) -> Result<(), EngineError> {
    let mut endpoints = Vec::new();
    for e in &inner.config.webhooks.endpoints {
        endpoints.push(NewWebhookEndpoint {
            id: e.id(),
            app: AppId::new(e.app.clone())?,
            url: e.url.clone(),
            secret: e.secret.clone(),
            events: e.events.clone(),
            budget_thresholds: check_thresholds(&e.budget_thresholds)?,
            enabled: e.enabled,
            description: None,
            from_config: true,
        });
    }
    Ok(inner.store.sync_config_webhook_endpoints(endpoints).await?)
}
