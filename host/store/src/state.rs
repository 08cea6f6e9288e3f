//! The rollout state machine: which status changes are legal, and how.

use agl_wire::rollout::RolloutStatus;

/// How a legal transition is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The current attempt changes status (`set_status`, `cancel`).
    SameAttempt,
    /// A failed attempt is re-queued as attempt + 1 (`retry` only).
    NewAttempt,
}

/// The whole transition table; `None` = illegal.
pub fn transition(from: RolloutStatus, to: RolloutStatus) -> Option<Step> {
    use RolloutStatus::*;
    match (from, to) {
        (Queued, Running | Cancelled) => Some(Step::SameAttempt),
        (Running, Succeeded | Failed | Cancelled) => Some(Step::SameAttempt),
        (Failed, Queued) => Some(Step::NewAttempt),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RolloutStatus::*;

    #[test]
    fn table_over_all_pairs() {
        let legal = [
            (Queued, Running, Step::SameAttempt),
            (Queued, Cancelled, Step::SameAttempt),
            (Running, Succeeded, Step::SameAttempt),
            (Running, Failed, Step::SameAttempt),
            (Running, Cancelled, Step::SameAttempt),
            (Failed, Queued, Step::NewAttempt),
        ];
        for from in RolloutStatus::ALL {
            for to in RolloutStatus::ALL {
                let want = legal
                    .iter()
                    .find(|(f, t, _)| *f == from && *t == to)
                    .map(|l| l.2);
                assert_eq!(transition(from, to), want, "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn status_names_round_trip() {
        for s in RolloutStatus::ALL {
            assert_eq!(RolloutStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(RolloutStatus::parse("done"), None);
    }
}
