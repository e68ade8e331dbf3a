//! The names of scratch databases, spares and the migrated template, and what identifies a
//! server.

use postgres::Config;
use ticketflow_core::store::migrate::{self, Migration};
use uuid::Uuid;

/// The prefix of every template's name: `tf_template_<hash>`.
pub const TEMPLATE_PREFIX: &str = "tf_template_";

/// The template's name for this build's PostgreSQL migrations ([`migrate::POSTGRES`]):
/// [`template_name_for`] them.
pub fn template_name() -> String {
    template_name_for(migrate::POSTGRES)
}

/// The template's name for `migrations`: [`TEMPLATE_PREFIX`] and the first 16 hex digits of
/// the SHA-256 of each migration's `version:checksum` line (32 bytes, within PostgreSQL's 63).
pub fn template_name_for(migrations: &[Migration]) -> String {
    let lines: String = migrations
        .iter()
        .map(|m| format!("{}:{}\n", m.version, m.checksum()))
        .collect();
    let hash = ticketflow_core::fingerprint::sha256_hex(lines.as_bytes());
    format!("{TEMPLATE_PREFIX}{}", &hash[..16])
}

/// What identifies a server here: hosts, ports and user.
pub(super) fn server_key(server: &Config) -> String {
    format!(
        "{:?}|{:?}|{:?}",
        server.get_hosts(),
        server.get_ports(),
        server.get_user()
    )
}

/// The environment variable whose value (sanitized, at most 12 characters) goes into every
/// scratch database's name right after `tf_`: `tf_<tag>_<label>_<random>`. Tests set it to
/// tell their databases from those of other processes on the same server.
pub const SCRATCH_TAG_VAR: &str = "TICKETFLOW_SCRATCH_TAG";

/// Lowercase ASCII letters and digits of `text`, anything else as `_`, at most `max` of them.
fn slug(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(max)
        .collect()
}

/// A new scratch database's name with `label` in it ([`scratch_name`]): the tag from
/// [`SCRATCH_TAG_VAR`], ten random hex digits.
pub(super) fn fresh_name(label: &str) -> String {
    scratch_name(
        std::env::var(SCRATCH_TAG_VAR).ok().as_deref(),
        label,
        &Uuid::new_v4().simple().to_string()[..10],
    )
}

/// A spare scratch database's name ([`super::recycle`]): as a scratch database labelled
/// `spare`.
pub(super) fn spare_name() -> String {
    fresh_name("spare")
}

/// A scratch database's name: `tf_<label>_<random>`, or `tf_<tag>_<label>_<random>` with a
/// non-empty `tag` ([`SCRATCH_TAG_VAR`]). At most 3 + 13 + 33 + 10 = 59 bytes, within
/// PostgreSQL's 63.
fn scratch_name(tag: Option<&str>, label: &str, random: &str) -> String {
    let label = slug(label, 32);
    match tag.map(|t| slug(t, 12)).filter(|t| !t.is_empty()) {
        Some(tag) => format!("tf_{tag}_{label}_{random}"),
        None => format!("tf_{label}_{random}"),
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;

    #[test]
    fn the_template_name_fits_a_database_name_and_changes_with_the_migrations() {
        let name = template_name();
        assert!(name.starts_with(TEMPLATE_PREFIX));
        assert_eq!(name.len(), TEMPLATE_PREFIX.len() + 16);
        assert!(name.len() <= 63);
        assert_eq!(name, template_name());
        let mut edited = migrate::POSTGRES.to_vec();
        edited[0].sql = "CREATE TABLE edited (id int)";
        assert_ne!(template_name_for(&edited), name);
        assert_ne!(template_name_for(&migrate::POSTGRES[..1]), name);
    }
}
