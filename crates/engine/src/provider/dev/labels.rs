//! `classify`: the label the input's words point to (names, descriptions, cue words).

use super::pick;

/// Cue words of common label names (lower case).
const CUES: &[(&str, &[&str])] = &[
    (
        "spam",
        &[
            "free",
            "win",
            "winner",
            "prize",
            "cruise",
            "offer",
            "click",
            "lottery",
            "cash",
            "urgent",
            "congratulations",
            "deal",
        ],
    ),
    (
        "ham",
        &[
            "meeting", "report", "invoice", "schedule", "attached", "thanks", "tomorrow", "project",
        ],
    ),
    (
        "complaint",
        &[
            "refund",
            "broken",
            "bad",
            "terrible",
            "angry",
            "late",
            "worst",
            "disappointed",
            "problem",
            "not working",
        ],
    ),
    (
        "praise",
        &[
            "love",
            "great",
            "thanks",
            "thank",
            "excellent",
            "awesome",
            "amazing",
            "perfect",
            "happy",
        ],
    ),
    (
        "positive",
        &[
            "love",
            "great",
            "good",
            "excellent",
            "awesome",
            "amazing",
            "happy",
            "perfect",
        ],
    ),
    (
        "negative",
        &[
            "bad", "terrible", "awful", "hate", "worst", "angry", "broken", "poor",
        ],
    ),
    ("neutral", &["okay", "fine", "average"]),
    (
        "urgent",
        &["urgent", "asap", "immediately", "now", "down", "outage"],
    ),
    (
        "billing",
        &["invoice", "payment", "charge", "refund", "bill", "price"],
    ),
    (
        "support",
        &["help", "error", "issue", "problem", "broken", "bug"],
    ),
];

/// The label the input's words point to: each label scores the words of its name and
/// description, and its cue words, found in the input; ties and no cue at all fall back
/// to the hash pick, so answers stay deterministic.
pub(super) fn choose_label(
    input: &str,
    labels: &[tollgate_core::kinds::Label],
    seed: u64,
) -> usize {
    let text = input.to_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |cue: &str| {
        if cue.contains(' ') {
            text.contains(cue)
        } else {
            words.contains(&cue)
        }
    };
    let scores: Vec<usize> = labels
        .iter()
        .map(|label| {
            let name = label.name().to_lowercase();
            let own = name
                .split(|c: char| !c.is_alphanumeric())
                .chain(
                    label
                        .description()
                        .unwrap_or_default()
                        .split(|c: char| !c.is_alphanumeric()),
                )
                .filter(|w| w.len() > 3)
                .filter(|w| has(&w.to_lowercase()))
                .count();
            let cues = CUES
                .iter()
                .filter(|(label, _)| *label == name)
                .flat_map(|(_, cues)| cues.iter())
                .filter(|cue| has(cue))
                .count();
            own + cues
        })
        .collect();
    let best = scores.iter().copied().max().unwrap_or(0);
    let leaders: Vec<usize> = (0..labels.len()).filter(|&i| scores[i] == best).collect();
    if best == 0 || leaders.is_empty() {
        pick(seed, labels.len())
    } else {
        leaders[pick(seed, leaders.len())]
    }
}
