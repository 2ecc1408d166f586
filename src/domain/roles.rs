//! Operators and what each role may do: the one place that decides
//! whether an operator may take an action ([`Role::may`]).
//!
//! - `viewer` reads the operators' side (dashboards, sagas, the review
//!   queue, providers, terminals) and changes nothing.
//! - `moderator` also decides what the public sees: approve, reject, hide
//!   and unhide.
//! - `admin` does everything: settings, cancel and retry, the breaker,
//!   operators, erasure, export and the audit trail.
//!
//! The bootstrap token (`OPERATOR_TOKEN`) is an admin named `bootstrap`
//! with no operator id.

use std::fmt;
use std::str::FromStr;

/// An operator's role, from least to most allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Viewer,
    Moderator,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Moderator, Role::Viewer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Moderator => "moderator",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may take an action that `needs` that role: every
    /// role may do what the roles below it may.
    pub fn may(self, needs: Role) -> bool {
        self >= needs
    }

    /// `a` or `an`, for messages.
    pub fn article(self) -> &'static str {
        match self {
            Role::Admin => "an",
            Role::Moderator | Role::Viewer => "a",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| "role must be \"admin\", \"moderator\" or \"viewer\"".to_owned())
    }
}

/// The name the bootstrap admin is recorded under.
pub const BOOTSTRAP_NAME: &str = "bootstrap";

/// Who is asking, once their token is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// None for the bootstrap admin.
    pub id: Option<String>,
    pub name: String,
    pub role: Role,
}

impl Operator {
    /// The holder of `OPERATOR_TOKEN`.
    pub fn bootstrap() -> Operator {
        Operator {
            id: None,
            name: BOOTSTRAP_NAME.to_owned(),
            role: Role::Admin,
        }
    }

    /// Why this operator may not take an action that `needs` a role, if
    /// they may not.
    pub fn refusal(&self, needs: Role) -> Option<String> {
        (!self.role.may(needs)).then(|| {
            format!(
                "this needs the {needs} role; {} is {} {}",
                self.name,
                self.role.article(),
                self.role
            )
        })
    }
}

/// A new operator's name: 1 to 80 characters after trimming, no control
/// characters.
pub fn operator_name(text: &str) -> Result<String, String> {
    let name = text.trim();
    let len = name.chars().count();
    if len == 0 || len > 80 || name.chars().any(char::is_control) {
        return Err("name must be 1 to 80 characters without control characters".into());
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_may_what_the_roles_below_may() {
        assert!(Role::Admin.may(Role::Moderator));
        assert!(Role::Admin.may(Role::Viewer));
        assert!(Role::Moderator.may(Role::Viewer));
        assert!(Role::Moderator.may(Role::Moderator));
        assert!(!Role::Moderator.may(Role::Admin));
        assert!(!Role::Viewer.may(Role::Moderator));
    }

    #[test]
    fn a_refusal_names_the_role_needed_and_the_one_held() {
        let moderator = Operator {
            id: Some("m".into()),
            name: "Mina".into(),
            role: Role::Moderator,
        };
        assert_eq!(
            moderator.refusal(Role::Admin).as_deref(),
            Some("this needs the admin role; Mina is a moderator")
        );
        assert_eq!(moderator.refusal(Role::Moderator), None);
        assert_eq!(Operator::bootstrap().refusal(Role::Admin), None);
    }

    #[test]
    fn roles_parse_from_their_names_only() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!("Admin".parse::<Role>().is_err());
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn names_are_trimmed_and_bounded() {
        assert_eq!(operator_name("  Mina ").as_deref(), Ok("Mina"));
        assert!(operator_name("   ").is_err());
        assert!(operator_name(&"x".repeat(81)).is_err());
        assert!(operator_name("a\u{7}b").is_err());
    }
}
