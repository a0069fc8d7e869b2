//! What a scenario measured: a readable table, or one JSON object.

use super::measure::Percentiles;
use serde_json::{Map, Value, json};

/// The result of one scenario on one backend.
#[derive(Debug, Clone)]
pub struct ScenarioReport {
    scenario: &'static str,
    backend: &'static str,
    params: Map<String, Value>,
    tollgate_per_s: Option<f64>,
    baseline_per_s: Option<f64>,
    ratio: Option<f64>,
    target: Option<Target>,
    rows: Vec<Row>,
    extra: Map<String, Value>,
    notes: Vec<String>,
}

/// The goal a ratio (or a count) is held to.
#[derive(Debug, Clone)]
struct Target {
    text: String,
    met: bool,
}

/// One line of the readable table.
#[derive(Debug, Clone)]
struct Row {
    label: String,
    per_s: Option<f64>,
    latency: Option<Percentiles>,
    json_key: Option<&'static str>,
}

impl ScenarioReport {
    /// An empty report.
    pub fn new(scenario: &'static str, backend: &'static str) -> ScenarioReport {
        ScenarioReport {
            scenario,
            backend,
            params: Map::new(),
            tollgate_per_s: None,
            baseline_per_s: None,
            ratio: None,
            target: None,
            rows: Vec::new(),
            extra: Map::new(),
            notes: Vec::new(),
        }
    }

    /// Records a parameter of the run.
    pub fn param(&mut self, name: &str, value: impl Into<Value>) -> &mut Self {
        self.params.insert(name.to_string(), value.into());
        self
    }

    /// Tollgate's rate, shown as a row labelled `label`; its latency when measured.
    pub fn tollgate(&mut self, label: &str, per_s: f64, latency: Option<Percentiles>) -> &mut Self {
        self.tollgate_per_s = Some(per_s);
        self.rows.push(Row {
            label: label.to_string(),
            per_s: Some(per_s),
            latency,
            json_key: Some("tollgate"),
        });
        self
    }

    /// The baseline's rate, shown as a row labelled `label`; its latency when measured.
    pub fn baseline(&mut self, label: &str, per_s: f64, latency: Option<Percentiles>) -> &mut Self {
        self.baseline_per_s = Some(per_s);
        self.rows.push(Row {
            label: label.to_string(),
            per_s: Some(per_s),
            latency,
            json_key: Some("baseline"),
        });
        self
    }

    /// Another row of the table (context, not the ratio's terms).
    pub fn row(
        &mut self,
        label: &str,
        per_s: Option<f64>,
        latency: Option<Percentiles>,
    ) -> &mut Self {
        self.rows.push(Row {
            label: label.to_string(),
            per_s,
            latency,
            json_key: None,
        });
        self
    }

    /// Sets the ratio tollgate / baseline and the target it must reach (at least `min`).
    pub fn ratio_at_least(&mut self, min: f64) -> &mut Self {
        if let (Some(t), Some(b)) = (self.tollgate_per_s, self.baseline_per_s) {
            let ratio = if b > 0.0 { t / b } else { f64::INFINITY };
            self.ratio = Some(ratio);
            self.target = Some(Target {
                text: format!("≥ {min}"),
                met: ratio >= min,
            });
        }
        self
    }

    /// Sets the ratio without a target (reported only).
    pub fn ratio_reported(&mut self) -> &mut Self {
        if let (Some(t), Some(b)) = (self.tollgate_per_s, self.baseline_per_s) {
            self.ratio = Some(if b > 0.0 { t / b } else { f64::INFINITY });
        }
        self
    }

    /// A target that is not a ratio (e.g. writes per interval).
    pub fn target(&mut self, text: impl Into<String>, met: bool) -> &mut Self {
        self.target = Some(Target {
            text: text.into(),
            met,
        });
        self
    }

    /// An extra JSON field.
    pub fn extra(&mut self, name: &str, value: impl Into<Value>) -> &mut Self {
        self.extra.insert(name.to_string(), value.into());
        self
    }

    /// Where Tollgate's side spent its time in the store (calls and seconds per method,
    /// from the counting store): a JSON field `tollgate_store_profile` and one line.
    pub fn store_profile(
        &mut self,
        profile: &[(&'static str, u64, std::time::Duration)],
    ) -> &mut Self {
        let json: Vec<Value> = profile
            .iter()
            .map(|(m, n, t)| json!({"method": m, "calls": n, "seconds": round3(t.as_secs_f64())}))
            .collect();
        self.extra("tollgate_store_profile", json);
        let top: Vec<String> = profile
            .iter()
            .take(4)
            .map(|(m, n, t)| format!("{m} {n}× {:.2} s", t.as_secs_f64()))
            .collect();
        if !top.is_empty() {
            self.note(format!(
                "tollgate store time (summed over concurrent calls): {}",
                top.join(", ")
            ));
        }
        self
    }

    /// A line printed under the table.
    pub fn note(&mut self, note: impl Into<String>) -> &mut Self {
        self.notes.push(note.into());
        self
    }

    /// The JSON object: scenario, backend, parameters, both rates, the ratio, the
    /// target, latency percentiles (where measured) and the scenario's own fields.
    pub fn to_json(&self) -> Value {
        let mut latency = Map::new();
        for row in &self.rows {
            if let (Some(key), Some(p)) = (row.json_key, row.latency) {
                latency.insert(key.to_string(), json!(p));
            }
        }
        let mut out = Map::new();
        out.insert("scenario".into(), json!(self.scenario));
        out.insert("backend".into(), json!(self.backend));
        out.insert("params".into(), Value::Object(self.params.clone()));
        out.insert(
            "tollgate_per_s".into(),
            json!(self.tollgate_per_s.map(round3)),
        );
        out.insert(
            "baseline_per_s".into(),
            json!(self.baseline_per_s.map(round3)),
        );
        out.insert("ratio".into(), json!(self.ratio.map(round3)));
        out.insert(
            "target".into(),
            json!(self.target.as_ref().map(|t| t.text.clone())),
        );
        out.insert(
            "target_met".into(),
            json!(self.target.as_ref().map(|t| t.met)),
        );
        if !latency.is_empty() {
            out.insert("latency_ms".into(), Value::Object(latency));
        }
        for (k, v) in &self.extra {
            out.insert(k.clone(), v.clone());
        }
        Value::Object(out)
    }

    /// Prints the readable table.
    pub fn print(&self) {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", plain(v)))
            .collect();
        println!();
        println!(
            "{} on {}  ({})",
            self.scenario,
            self.backend,
            params.join(", ")
        );
        let width = self
            .rows
            .iter()
            .map(|r| r.label.chars().count())
            .max()
            .unwrap_or(0)
            .max(24);
        let any_latency = self.rows.iter().any(|r| r.latency.is_some());
        if any_latency {
            println!(
                "  {:<width$} {:>12} {:>9} {:>9} {:>9}",
                "", "per s", "p50 ms", "p90 ms", "p99 ms"
            );
        } else {
            println!("  {:<width$} {:>12}", "", "per s");
        }
        for row in &self.rows {
            let rate = row.per_s.map_or("-".to_string(), |r| format!("{r:.1}"));
            match row.latency {
                Some(p) => println!(
                    "  {:<width$} {:>12} {:>9.2} {:>9.2} {:>9.2}",
                    row.label, rate, p.p50_ms, p.p90_ms, p.p99_ms
                ),
                None => println!("  {:<width$} {rate:>12}", row.label),
            }
        }
        match (self.ratio, &self.target) {
            (Some(ratio), Some(t)) => println!(
                "  {:<width$} {ratio:>12.2}   target {}: {}",
                "ratio tollgate / baseline",
                t.text,
                met(t.met)
            ),
            (Some(ratio), None) => {
                println!("  {:<width$} {ratio:>12.2}", "ratio tollgate / baseline")
            }
            (None, Some(t)) => println!("  target {}: {}", t.text, met(t.met)),
            (None, None) => {}
        }
        for note in &self.notes {
            println!("  {note}");
        }
    }
}

/// One line per scenario, after `all`.
pub fn print_summary(reports: &[ScenarioReport]) {
    println!();
    println!(
        "{:<18} {:<9} {:>12} {:>12} {:>8}  target",
        "scenario", "backend", "tollgate/s", "baseline/s", "ratio"
    );
    let num =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    for r in reports {
        let target = r
            .target
            .as_ref()
            .map_or("-".to_string(), |t| format!("{} {}", t.text, met(t.met)));
        println!(
            "{:<18} {:<9} {:>12} {:>12} {:>8}  {target}",
            r.scenario,
            r.backend,
            num(r.tollgate_per_s, 1),
            num(r.baseline_per_s, 1),
            num(r.ratio, 2),
        );
    }
}

fn met(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn round3(v: f64) -> f64 {
    if v.is_finite() {
        (v * 1000.0).round() / 1000.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_fields_every_scenario_promises() {
        let mut r = ScenarioReport::new("burn-down", "sqlite");
        r.param("tasks", 10)
            .tollgate("tollgate", 300.0, None)
            .baseline("baseline", 200.0, Percentiles::of(&[1000, 2000]))
            .ratio_at_least(0.5);
        let v = r.to_json();
        assert_eq!(v["scenario"], "burn-down");
        assert_eq!(v["backend"], "sqlite");
        assert_eq!(v["params"]["tasks"], 10);
        assert_eq!(v["tollgate_per_s"], 300.0);
        assert_eq!(v["baseline_per_s"], 200.0);
        assert_eq!(v["ratio"], 1.5);
        assert_eq!(v["target_met"], true);
        assert_eq!(v["latency_ms"]["baseline"]["p50_ms"], 1.0);
        assert!(v["latency_ms"].get("tollgate").is_none());
    }

    #[test]
    fn a_missed_target_says_so() {
        let mut r = ScenarioReport::new("admission", "postgres");
        r.tollgate("t", 100.0, None)
            .baseline("b", 100.0, None)
            .ratio_at_least(5.0);
        assert_eq!(r.to_json()["target_met"], false);
    }
}
