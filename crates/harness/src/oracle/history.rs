//! Histories: requests over a pool of scopes × keys × bodies, sequential or in concurrent
//! groups. What a body looks like on the wire is the runner's business; here a body is a
//! variant (an intent) and a form.

/// How a valid body is written on the wire. Every form of one variant is the same intent:
/// the fingerprint sees canonical JSON (members sorted, insignificant whitespace gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// Members in the template's order, compact.
    Plain,
    /// Members in reverse order.
    Reordered,
    /// Members in the template's order with spaces and a newline between them.
    Respaced,
}

/// A request body of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Body {
    /// Body variant `variant` (0-based) written in `form`.
    Valid {
        /// Which body of the pool: distinct variants are distinct intents.
        variant: usize,
        /// How it is written.
        form: Form,
    },
    /// A body the service must reject (a required member missing); it must change nothing.
    Invalid,
}

impl Body {
    /// The intent the body carries: its variant (every form of one variant is one intent), or
    /// `None` for [`Body::Invalid`].
    pub fn intent(&self) -> Option<usize> {
        match self {
            Body::Valid { variant, .. } => Some(*variant),
            Body::Invalid => None,
        }
    }
}

/// One request of a history: scope, key and body are indices into the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// The scope (tenant, user, API key) it is sent under.
    pub scope: usize,
    /// The idempotency key (unique per run once rendered).
    pub key: usize,
    /// The body.
    pub body: Body,
    /// The service instance it goes to (0 when there is one).
    pub instance: usize,
}

/// One step of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// One request, sent after every earlier step's answer arrived.
    One(Request),
    /// Two to four requests released together.
    Group(Vec<Request>),
    /// Wait the settle time, then recount the effects.
    Settle,
}

impl Step {
    /// The step's requests, in order (none for a settle).
    pub fn requests(&self) -> &[Request] {
        match self {
            Step::One(r) => std::slice::from_ref(r),
            Step::Group(rs) => rs,
            Step::Settle => &[],
        }
    }
}

/// A generated history: steps in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    /// The steps.
    pub steps: Vec<Step>,
}

impl History {
    /// How many requests the history sends.
    pub fn request_count(&self) -> usize {
        self.steps.iter().map(|s| s.requests().len()).sum()
    }

    /// The steps as lines a person reads: `1. A/k1 body 0 (reordered) → instance 1`, scopes
    /// named by letter.
    pub fn describe(&self) -> Vec<String> {
        self.describe_with(&[])
    }

    /// As [`History::describe`], scope `i` named `scopes[i]` when given (else by letter).
    pub fn describe_with(&self, scopes: &[Option<String>]) -> Vec<String> {
        let request = |r: &Request| {
            let body = match r.body {
                Body::Invalid => "an invalid body".to_string(),
                Body::Valid { variant, form } => match form {
                    Form::Plain => format!("body {variant}"),
                    Form::Reordered => format!("body {variant} (members reordered)"),
                    Form::Respaced => format!("body {variant} (re-spaced)"),
                },
            };
            let scope = scopes
                .get(r.scope)
                .cloned()
                .flatten()
                .unwrap_or_else(|| char::from(b'A' + (r.scope % 26) as u8).to_string());
            let instance = if r.instance > 0 {
                format!(" → instance {}", r.instance + 1)
            } else {
                String::new()
            };
            format!("{scope}/k{} {body}{instance}", r.key + 1)
        };
        self.steps
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Step::One(r) => format!("{}. {}", i + 1, request(r)),
                Step::Group(rs) => format!(
                    "{}. together: {}",
                    i + 1,
                    rs.iter().map(request).collect::<Vec<_>>().join(" | ")
                ),
                Step::Settle => format!("{}. settle, then recount", i + 1),
            })
            .collect()
    }
}
