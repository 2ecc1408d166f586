//! A participant's session status, as the API shows it. A session accepts a
//! submission when OPEN or ABORTED (a new try after a failure).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SessionStatus {
    Open,
    Submitting,
    Completed,
    Aborted,
}

impl SessionStatus {
    pub const ALL: [SessionStatus; 4] = [
        SessionStatus::Open,
        SessionStatus::Submitting,
        SessionStatus::Completed,
        SessionStatus::Aborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Open => "OPEN",
            SessionStatus::Submitting => "SUBMITTING",
            SessionStatus::Completed => "COMPLETED",
            SessionStatus::Aborted => "ABORTED",
        }
    }

    pub fn accepts_submission(self) -> bool {
        matches!(self, SessionStatus::Open | SessionStatus::Aborted)
    }
}

impl fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_open_and_aborted_accept_a_submission() {
        let accepting: Vec<_> = SessionStatus::ALL
            .into_iter()
            .filter(|s| s.accepts_submission())
            .collect();
        assert_eq!(accepting, vec![SessionStatus::Open, SessionStatus::Aborted]);
    }
}
