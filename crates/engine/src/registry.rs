//! What configuration resolves at submit time: model ids to model refs and config hashes,
//! and budget policy names to [`Budget`]s (docs/conformance.md#concepts, docs/conformance.md#budget-policies).

use crate::config::{ConfigError, EngineConfig};
use crate::error::EngineError;
use std::collections::HashMap;
use std::num::NonZeroU32;
use tollgate_core::{
    AppId, Budget, BudgetName, ConfigHash, GlobalShare, ModelId, ModelRef, Prices, Route, Weight,
};

/// A model id resolved from configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedModel {
    /// The id callers use.
    pub id: ModelId,
    /// Provider, provider model name and parameters.
    pub model_ref: ModelRef,
    /// Hash of `model_ref`: changing any parameter changes it, so old cache entries stop
    /// matching.
    pub config_hash: ConfigHash,
    /// docs/conformance.md#cost-prices: the model's prices (`None`: unpriced); a route's
    /// first deployment's (each deployment's are in `route`).
    pub prices: Option<Prices>,
    /// docs/routes.md, "Attempts": the model's `max_attempts`, when set.
    pub max_attempts: Option<tollgate_core::MaxAttempts>,
    /// docs/routes.md: the model's route, a route of one for a single deployment.
    pub route: Route,
}

/// Model id → [`ResolvedModel`].
#[derive(Debug, Clone)]
pub struct ModelRegistry {
    default: ModelId,
    models: HashMap<ModelId, ResolvedModel>,
}

impl ModelRegistry {
    /// Builds the registry from a configuration (which should be validated; problems are
    /// reported with their keys all the same).
    pub fn from_config(config: &EngineConfig) -> Result<ModelRegistry, ConfigError> {
        let default = ModelId::new(config.default_model.as_str())
            .map_err(|e| ConfigError::at("default_model", e.to_string()))?;
        let mut models = HashMap::new();
        for (id, model) in &config.models {
            let key = format!("models.{id}");
            let id = ModelId::new(id.as_str()).map_err(|e| ConfigError::at(&key, e.to_string()))?;
            let model_ref = model.model_ref(|p| config.provider_kind(p));
            let config_hash = model_ref
                .config_hash()
                .map_err(|e| ConfigError::at(format!("{key}.params"), e.to_string()))?;
            for (i, d) in model.deployment_configs().iter().enumerate() {
                if let Some(Err((field, m))) = d.prices.as_ref().map(|p| p.to_core()) {
                    let at = if model.is_route() {
                        format!("{key}.deployments[{i}].prices.{field}")
                    } else {
                        format!("{key}.prices.{field}")
                    };
                    return Err(ConfigError::at(at, m));
                }
            }
            let route = model.route(|p| config.provider_kind(p));
            let prices = route.deployments[0].prices;
            models.insert(
                id.clone(),
                ResolvedModel {
                    id,
                    model_ref,
                    config_hash,
                    prices,
                    max_attempts: model.max_attempts,
                    route,
                },
            );
        }
        if !models.contains_key(&default) {
            return Err(ConfigError::at(
                "default_model",
                format!("names model `{default}`, which is not under [models]"),
            ));
        }
        Ok(ModelRegistry { default, models })
    }

    /// The model a submission asked for (`None`: the default model).
    pub fn resolve(&self, id: Option<&ModelId>) -> Result<&ResolvedModel, EngineError> {
        let id = id.unwrap_or(&self.default);
        self.models
            .get(id)
            .ok_or_else(|| EngineError::UnknownModel {
                model: id.to_string(),
                known: self.ids().iter().map(ModelId::to_string).collect(),
            })
    }

    /// The default model id.
    pub fn default_id(&self) -> &ModelId {
        &self.default
    }

    /// Every configured model id, sorted.
    pub fn ids(&self) -> Vec<ModelId> {
        let mut ids: Vec<ModelId> = self.models.keys().cloned().collect();
        ids.sort();
        ids
    }
}

/// One app's budget choices.
#[derive(Debug, Clone, PartialEq)]
struct AppPolicy {
    default: BudgetName,
    allowed: Vec<BudgetName>,
    /// docs/conformance.md#cost-limits: the app-wide spend limit, nano-dollars.
    usd_per_24_hours: Option<std::num::NonZeroU64>,
    /// Its share of the global capacity (docs/budgets.md).
    global_share: Option<GlobalShare>,
}

/// Budget policy names → [`Budget`]s, per app (docs/conformance.md#budget-policies). Callers never send budget
/// numbers: they may only name a policy their app is allowed to use.
#[derive(Debug, Clone)]
pub struct BudgetPolicies {
    policies: HashMap<BudgetName, Budget>,
    /// docs/conformance.md#fair-share: each policy's dispatch weight.
    weights: HashMap<BudgetName, Weight>,
    apps: HashMap<AppId, AppPolicy>,
    /// The policy of apps without one of their own (the top-level `default_budget`);
    /// `None` when that names no budget and no app uses it.
    fallback: Option<AppPolicy>,
}

impl BudgetPolicies {
    /// Builds the policies from a configuration; `global_concurrent` comes from
    /// `[admission]`.
    pub fn from_config(config: &EngineConfig) -> Result<BudgetPolicies, ConfigError> {
        let global: NonZeroU32 = config
            .admission
            .global_concurrent
            .positive()
            .map_err(|m| ConfigError::at("admission.global_concurrent", m))?;
        let mut policies = HashMap::new();
        let mut weights = HashMap::new();
        for (name, policy) in &config.budgets {
            let key = format!("budgets.{name}");
            let field = |field: &str, value: crate::config::Limit| {
                value
                    .positive()
                    .map_err(|m| ConfigError::at(format!("{key}.{field}"), m))
            };
            let budget = Budget {
                max_steps_per_source: field("max_steps_per_source", policy.max_steps_per_source)?,
                sources_per_24_hours: field("sources_per_24_hours", policy.sources_per_24_hours)?,
                scope_concurrent: field("scope_concurrent", policy.scope_concurrent)?,
                global_concurrent: global,
                burst: field("burst", policy.burst)?,
                tasks_per_minute: field("tasks_per_minute", policy.tasks_per_minute)?,
                cost: policy
                    .cost_limits()
                    .map_err(|(f, m)| ConfigError::at(format!("{key}.{f}"), m))?,
                global_share: None,
            };
            let weight = field("weight", policy.weight).and_then(|w| {
                Weight::new(i64::from(w.get()))
                    .map_err(|e| ConfigError::at(format!("{key}.weight"), e.to_string()))
            })?;
            let name =
                BudgetName::new(name.as_str()).map_err(|e| ConfigError::at(&key, e.to_string()))?;
            weights.insert(name.clone(), weight);
            policies.insert(name, budget);
        }
        let known = |key: &str, name: &str| -> Result<BudgetName, ConfigError> {
            let parsed = BudgetName::new(name).map_err(|e| ConfigError::at(key, e.to_string()))?;
            if policies.contains_key(&parsed) {
                Ok(parsed)
            } else {
                Err(ConfigError::at(
                    key,
                    format!("names budget `{name}`, which is not under [budgets]"),
                ))
            }
        };
        let fallback_default = known("default_budget", &config.default_budget);
        let shares = crate::config::app_shares(&config.apps, global.get())
            .map_err(|m| ConfigError::at("apps", m))?;
        let reserved = shares
            .as_ref()
            .map_or(0, |s| s.values().copied().sum::<u32>());
        // An app that is not configured has no share of its own: it may only borrow.
        let share_of = |app: Option<&String>| {
            shares.as_ref().map(|s| GlobalShare {
                share: app.and_then(|a| s.get(a)).copied().unwrap_or(0),
                reserved,
            })
        };
        let fallback = fallback_default.as_ref().ok().map(|default| AppPolicy {
            default: default.clone(),
            allowed: vec![default.clone()],
            usd_per_24_hours: None,
            global_share: share_of(None),
        });
        let mut apps = HashMap::new();
        for (app, conf) in &config.apps {
            let key = format!("apps.{app}");
            let app_id =
                AppId::new(app.as_str()).map_err(|e| ConfigError::at(&key, e.to_string()))?;
            let default = match &conf.default_budget {
                Some(name) => known(&format!("{key}.default_budget"), name)?,
                None => fallback_default.clone()?,
            };
            let allowed = match &conf.allowed_budgets {
                Some(names) => names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| known(&format!("{key}.allowed_budgets[{i}]"), n))
                    .collect::<Result<Vec<_>, _>>()?,
                None => vec![default.clone()],
            };
            if !allowed.contains(&default) {
                return Err(ConfigError::at(
                    format!("{key}.default_budget"),
                    format!("`{default}` is not in allowed_budgets"),
                ));
            }
            let usd_per_24_hours = conf
                .usd_per_24_hours
                .map(|usd| tollgate_core::cost::usd_limit_from_f64("usd_per_24_hours", usd))
                .transpose()
                .map_err(|e| ConfigError::at(format!("{key}.usd_per_24_hours"), e.to_string()))?;
            apps.insert(
                app_id,
                AppPolicy {
                    default,
                    allowed,
                    usd_per_24_hours,
                    global_share: share_of(Some(app)),
                },
            );
        }
        Ok(BudgetPolicies {
            policies,
            weights,
            apps,
            fallback,
        })
    }

    /// docs/conformance.md#fair-share: the dispatch weight of a policy (1 for a name that is not one).
    pub fn weight(&self, name: &BudgetName) -> Weight {
        self.weights.get(name).copied().unwrap_or_default()
    }

    /// The budget of a scoped task of `app` that names `requested` (or none: the app's
    /// default). A policy the app may not use, or that does not exist, is
    /// [`EngineError::BudgetNotAllowed`].
    pub fn resolve(
        &self,
        app: &AppId,
        requested: Option<&BudgetName>,
    ) -> Result<(BudgetName, Budget), EngineError> {
        let Some(policy) = self.apps.get(app).or(self.fallback.as_ref()) else {
            return Err(EngineError::BudgetNotAllowed {
                app: app.to_string(),
                budget: requested.map(ToString::to_string).unwrap_or_default(),
                allowed: Vec::new(),
            });
        };
        let name = requested.unwrap_or(&policy.default);
        let budget = policy
            .allowed
            .contains(name)
            .then(|| self.policies.get(name))
            .flatten()
            .ok_or_else(|| EngineError::BudgetNotAllowed {
                app: app.to_string(),
                budget: name.to_string(),
                allowed: policy.allowed.iter().map(ToString::to_string).collect(),
            })?;
        let mut budget = *budget;
        budget.cost.app_nano_per_24_hours = policy.usd_per_24_hours;
        budget.global_share = policy.global_share;
        Ok((name.clone(), budget))
    }

    /// docs/conformance.md#cost-limits: the app-wide spend limit in nano-dollars, if any.
    pub fn app_spend_limit(&self, app: &AppId) -> Option<std::num::NonZeroU64> {
        self.apps
            .get(app)
            .or(self.fallback.as_ref())
            .and_then(|policy| policy.usd_per_24_hours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AppConfig, BudgetPolicy, Limit};
    use tollgate_core::ErrorCode;

    fn config() -> EngineConfig {
        let mut c = EngineConfig::default();
        c.budgets.insert(
            "premium".into(),
            BudgetPolicy {
                weight: Limit::Integer(1),
                burst: Limit::Integer(500),
                ..BudgetPolicy::default()
            },
        );
        c.apps.insert(
            "acme".into(),
            AppConfig {
                default_budget: Some("standard".into()),
                allowed_budgets: Some(vec!["standard".into(), "premium".into()]),
                api_keys: None,
                usd_per_24_hours: None,
                global_concurrent_share: None,
                trace_content: false,
                max_attempts: None,
            },
        );
        c.admission.global_concurrent = Limit::Integer(77);
        c
    }

    #[test]
    fn apps_use_their_default_or_an_allowed_policy() {
        let p = BudgetPolicies::from_config(&config()).unwrap();
        let acme = AppId::new("acme").unwrap();
        let (name, budget) = p.resolve(&acme, None).unwrap();
        assert_eq!(name.as_str(), "standard");
        assert_eq!(budget.global_concurrent.get(), 77);
        let premium = BudgetName::new("premium").unwrap();
        assert_eq!(p.resolve(&acme, Some(&premium)).unwrap().1.burst.get(), 500);
        // An app that is not configured may use only the default policy.
        let other = AppId::new("other").unwrap();
        let err = p.resolve(&other, Some(&premium)).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::BudgetNotAllowed));
        assert!(err.to_string().contains("premium"), "{err}");
        let missing = BudgetName::new("gold").unwrap();
        assert!(p.resolve(&acme, Some(&missing)).is_err());
    }

    #[test]
    fn unknown_models_are_typed_errors() {
        let r = ModelRegistry::from_config(&config()).unwrap();
        assert_eq!(r.resolve(None).unwrap().id.as_str(), "default");
        let err = r.resolve(Some(&ModelId::new("nope").unwrap())).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::UnknownModel));
        assert!(err.to_string().contains("`default`"), "{err}");
    }
}
