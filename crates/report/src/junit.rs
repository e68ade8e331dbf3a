//! `report.junit.xml`: every judged [`Item`] as a JUnit test case, in the shape of the JUnit
//! XML that Maven Surefire writes and Jenkins, GitLab, GitHub Actions reporters and Azure
//! Pipelines read (Jenkins' `junit-10.xsd`):
//!
//! ```text
//! testsuites (name, tests, failures, errors, skipped, time)
//!   testsuite (name, tests, failures, errors, skipped, time, timestamp, hostname)
//!     properties / property (name, value)
//!     testcase (name, classname, time)
//!       failure (message, type) text | skipped (message)
//!     system-out, system-err
//! ```
//!
//! FAIL is a `<failure>`, PENDING a `<skipped>` (it did not run), PASS an empty test case.
//! Groups of items ([`Item::group`]) become test suites.

use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;

use super::{items, Item, ReportInput, Scope};
use ticketflow_harness::verdict::Verdict;

type W = Writer<Vec<u8>>;

fn write(w: &mut W, e: Event<'_>) {
    w.write_event(e).expect("writing XML to memory cannot fail");
}

fn secs(items: &[&Item]) -> String {
    format!(
        "{:.3}",
        items
            .iter()
            .filter_map(|i| i.seconds)
            .fold(0.0_f64, |a, b| a + b.max(0.0))
    )
}

fn count(items: &[&Item], v: Verdict) -> String {
    items.iter().filter(|i| i.verdict == v).count().to_string()
}

/// Renders `report.junit.xml` (UTF-8, with an XML declaration) of a `verify` run.
pub fn render(input: &ReportInput<'_>) -> String {
    render_scoped(input, &Scope::Verify)
}

/// [`render`] for a report covering `scope`: the root `testsuites` is named after the
/// command that wrote it (`ticketflow verify`, `ticketflow scenario run`).
pub fn render_scoped(input: &ReportInput<'_>, scope: &Scope) -> String {
    let all = items(input);
    let mut groups: Vec<&str> = Vec::new();
    for i in &all {
        if !groups.contains(&i.group.as_str()) {
            groups.push(&i.group);
        }
    }
    let every: Vec<&Item> = all.iter().collect();
    // xs:dateTime without a zone, as the Ant/Surefire schema's timestamp wants; it is UTC.
    let timestamp: String = input.ctx.generated_at.chars().take(19).collect();
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    write(
        &mut w,
        Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)),
    );
    let mut root = BytesStart::new("testsuites");
    root.push_attribute((
        "name",
        match scope {
            Scope::Verify => "ticketflow verify",
            Scope::Files(_) => "ticketflow scenario run",
        },
    ));
    root.push_attribute(("tests", every.len().to_string().as_str()));
    root.push_attribute(("failures", count(&every, Verdict::Fail).as_str()));
    root.push_attribute(("errors", "0"));
    root.push_attribute(("skipped", count(&every, Verdict::Pending).as_str()));
    root.push_attribute(("time", secs(&every).as_str()));
    write(&mut w, Event::Start(root));
    for (n, group) in groups.iter().enumerate() {
        let mine: Vec<&Item> = all.iter().filter(|i| i.group == *group).collect();
        let mut suite = BytesStart::new("testsuite");
        suite.push_attribute(("name", *group));
        suite.push_attribute(("id", n.to_string().as_str()));
        suite.push_attribute(("package", "ticketflow"));
        suite.push_attribute(("tests", mine.len().to_string().as_str()));
        suite.push_attribute(("failures", count(&mine, Verdict::Fail).as_str()));
        suite.push_attribute(("errors", "0"));
        suite.push_attribute(("skipped", count(&mine, Verdict::Pending).as_str()));
        suite.push_attribute(("time", secs(&mine).as_str()));
        suite.push_attribute(("timestamp", timestamp.as_str()));
        suite.push_attribute(("hostname", "localhost"));
        write(&mut w, Event::Start(suite));
        write(&mut w, Event::Start(BytesStart::new("properties")));
        for (name, value) in [
            ("ticketflow.version", input.ctx.version.as_str()),
            ("ticketflow.command", input.ctx.command.as_str()),
            ("ticketflow.postgres_url", input.ctx.pg_url.as_str()),
        ] {
            let mut p = BytesStart::new("property");
            p.push_attribute(("name", name));
            p.push_attribute(("value", xml_safe(value).as_str()));
            write(&mut w, Event::Empty(p));
        }
        write(&mut w, Event::End(BytesEnd::new("properties")));
        for item in &mine {
            let mut case = BytesStart::new("testcase");
            let name = xml_safe(&item.name);
            case.push_attribute(("name", name.as_str()));
            case.push_attribute(("classname", format!("ticketflow.{group}").as_str()));
            case.push_attribute((
                "time",
                format!("{:.3}", item.seconds.unwrap_or(0.0)).as_str(),
            ));
            let reason = xml_safe(item.reason.as_deref().unwrap_or_default());
            match item.verdict {
                Verdict::Pass => write(&mut w, Event::Empty(case)),
                Verdict::Fail => {
                    write(&mut w, Event::Start(case));
                    let mut f = BytesStart::new("failure");
                    f.push_attribute(("message", first_line(&reason)));
                    f.push_attribute(("type", "FAIL"));
                    write(&mut w, Event::Start(f));
                    write(&mut w, Event::Text(BytesText::new(&reason)));
                    write(&mut w, Event::End(BytesEnd::new("failure")));
                    write(&mut w, Event::End(BytesEnd::new("testcase")));
                }
                Verdict::Pending => {
                    write(&mut w, Event::Start(case));
                    let mut s = BytesStart::new("skipped");
                    s.push_attribute(("message", format!("PENDING: {reason}").as_str()));
                    write(&mut w, Event::Empty(s));
                    write(&mut w, Event::End(BytesEnd::new("testcase")));
                }
            }
        }
        write(&mut w, Event::Empty(BytesStart::new("system-out")));
        write(&mut w, Event::Empty(BytesStart::new("system-err")));
        write(&mut w, Event::End(BytesEnd::new("testsuite")));
    }
    write(&mut w, Event::End(BytesEnd::new("testsuites")));
    let mut text = String::from_utf8(w.into_inner()).expect("the writer only writes UTF-8");
    text.push('\n');
    text
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// `text` with its secrets masked ([`ticketflow_harness::contain::mask`]) and every character XML 1.0
/// forbids (controls other than tab, newline and carriage return; U+FFFE, U+FFFF), every
/// other control character and the bidi controls ([`ticketflow_harness::contain::is_hazard`]) written as
/// `\u{..}`, so a failure reason that quotes a service's response or a racer's input cannot
/// make the file unreadable or rewrite the terminal it is shown on.
pub fn xml_safe(text: &str) -> String {
    let text = ticketflow_harness::contain::mask(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let allowed = matches!(c, '\t' | '\n')
            || (!ticketflow_harness::contain::is_hazard(c) && c != '\u{FFFE}' && c != '\u{FFFF}');
        if allowed {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    out
}
