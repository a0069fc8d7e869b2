//! Model references: what a model id resolves to, and the hash of that configuration.

use crate::canonical::hash_value;
use crate::error::InvalidInput;
use crate::route::Route;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// A resolved model configuration: which provider, which of its models, which
/// parameters. Its [`config_hash`](ModelRef::config_hash) changes whenever any part does,
/// which invalidates cached results made under the old configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    /// Provider name from configuration (`"dev"`, `"openai"`, …).
    pub provider: String,
    /// The provider's own model name.
    pub model: String,
    /// Provider parameters (temperature defaults, etc.).
    #[serde(default)]
    pub params: Map<String, Value>,
    /// The model id's route when it has more than the one deployment above (which is
    /// then its first): stored with the task, so a task keeps the route it was admitted
    /// under (docs/routes.md). `None`: a single deployment, `provider`/`model`/`params`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
}

impl ModelRef {
    /// A reference with no parameters.
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> ModelRef {
        ModelRef {
            provider: provider.into(),
            model: model.into(),
            params: Map::new(),
            route: None,
        }
    }

    /// SHA-256 of the canonical JSON of the whole configuration: the route's
    /// ([`Route::config_hash`]) when there is one.
    pub fn config_hash(&self) -> Result<ConfigHash, InvalidInput> {
        if let Some(route) = &self.route {
            return route.config_hash();
        }
        let value = json!({
            "provider": self.provider,
            "model": self.model,
            "params": self.params,
        });
        hash_value(&value)
            .map(ConfigHash)
            .map_err(|e| e.within("model.params"))
    }
}

/// The model config hash (hex SHA-256).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConfigHash(pub String);

impl ConfigHash {
    /// The hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changing_any_parameter_changes_the_hash() {
        let a = ModelRef::new("dev", "dev-1");
        let mut b = a.clone();
        b.params.insert("temperature".into(), json!(0.2));
        let c = ModelRef::new("dev", "dev-2");
        let ha = a.config_hash().unwrap();
        assert_ne!(ha, b.config_hash().unwrap());
        assert_ne!(ha, c.config_hash().unwrap());
        assert_eq!(ha, a.clone().config_hash().unwrap());
    }
}
