//! The findings for people (a table) and for programs (one JSON document).
//!
//! JSON (a contract; keys may be added, never renamed):
//! `{"tuners": [{"name": "swappiness", "current": "vm.swappiness = 60",
//! "recommended": "vm.swappiness ≤ 1", "pass": false, "required": false,
//! "why": "…"}], "required_failed": false}`; after `apply` each tuner also
//! has `"outcome"`: `unchanged`, `changed`, `failed: …` or `could not: …`.

use serde_json::{json, Value};

use crate::{Finding, Outcome};

/// One row per finding: status, name, current value, and for a failing
/// one what is recommended and why. `outcomes` (after `apply`) adds what
/// was done.
pub fn table(findings: &[Finding], outcomes: Option<&[Outcome]>) -> String {
    let width = findings.iter().map(|f| f.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (i, f) in findings.iter().enumerate() {
        let status = match (f.pass, f.required) {
            (true, _) => "ok  ",
            (false, true) => "FAIL",
            (false, false) => "warn",
        };
        out.push_str(&format!("{status}  {:width$}  {}\n", f.name, f.current));
        if !f.pass {
            out.push_str(&format!("      {:width$}  recommended: {}\n", "", f.recommended));
            out.push_str(&format!("      {:width$}  why: {}\n", "", f.why));
        }
        if let Some(outcome) = outcomes.and_then(|o| o.get(i)).filter(|o| **o != Outcome::Unchanged) {
            out.push_str(&format!("      {:width$}  apply: {}\n", "", outcome_text(outcome)));
        }
    }
    let failing = findings.iter().filter(|f| !f.pass).count();
    let required = findings.iter().filter(|f| !f.pass && f.required).count();
    out.push_str(&format!(
        "\n{} tuners: {} pass; {failing} fail: {required} required (FAIL), {} recommended (warn)\n",
        findings.len(),
        findings.len() - failing,
        failing - required
    ));
    out
}

/// The findings (and outcomes, after `apply`) as one JSON document.
pub fn json(findings: &[Finding], outcomes: Option<&[Outcome]>) -> Value {
    let tuners: Vec<Value> = findings
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut row = json!({
                "name": f.name,
                "current": f.current,
                "recommended": f.recommended,
                "pass": f.pass,
                "required": f.required,
                "why": f.why,
            });
            if let Some(outcome) = outcomes.and_then(|o| o.get(i)) {
                row["outcome"] = Value::String(outcome_text(outcome));
            }
            row
        })
        .collect();
    json!({ "tuners": tuners, "required_failed": crate::required_failed(findings) })
}

fn outcome_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Unchanged => "unchanged".into(),
        Outcome::Changed => "changed".into(),
        Outcome::Failed(e) => format!("failed: {e}"),
        Outcome::CouldNot(what) => format!("could not: {what}"),
    }
}
