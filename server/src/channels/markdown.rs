//! The agents write Markdown; each provider reads its own dialect:
//! Matrix takes HTML in `formatted_body` (raw HTML in the text is escaped,
//! never passed through), Slack takes mrkdwn, GitHub takes Markdown as is.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// Markdown as the HTML subset Matrix clients render. HTML written in the
/// Markdown is shown as text.
pub fn to_html(md: &str) -> String {
    let parser = Parser::new_ext(md, Options::ENABLE_STRIKETHROUGH).map(|e| match e {
        Event::Html(h) | Event::InlineHtml(h) => Event::Text(h),
        e => e,
    });
    let mut out = String::new();
    pulldown_cmark::html::push_html(&mut out, parser);
    out.trim_end().to_string()
}

fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Markdown as Slack's mrkdwn: `*bold*`, `_italic_`, `~strike~`,
/// `<url|text>`, headings as bold lines, code as is.
pub fn to_mrkdwn(md: &str) -> String {
    let mut out = String::new();
    let mut link: Vec<String> = Vec::new();
    let mut list_depth = 0usize;
    for e in Parser::new_ext(md, Options::ENABLE_STRIKETHROUGH) {
        match e {
            Event::Start(Tag::Strong) | Event::End(TagEnd::Strong) => out.push('*'),
            Event::Start(Tag::Emphasis) | Event::End(TagEnd::Emphasis) => out.push('_'),
            Event::Start(Tag::Strikethrough) | Event::End(TagEnd::Strikethrough) => out.push('~'),
            Event::Start(Tag::Heading { .. }) => out.push('*'),
            Event::End(TagEnd::Heading(_)) => out.push_str("*\n"),
            Event::Start(Tag::Link { dest_url, .. }) => {
                link.push(dest_url.to_string());
                out.push('<');
                out.push_str(&slack_escape(&dest_url));
                out.push('|');
            }
            Event::End(TagEnd::Link) => {
                link.pop();
                out.push('>');
            }
            Event::Start(Tag::List(_)) => list_depth += 1,
            Event::End(TagEnd::List(_)) => {
                list_depth = list_depth.saturating_sub(1);
                if list_depth == 0 {
                    out.push('\n');
                }
            }
            Event::Start(Tag::Item) => {
                out.push_str(&"  ".repeat(list_depth.saturating_sub(1)));
                out.push_str("• ");
            }
            Event::End(TagEnd::Item) if !out.ends_with('\n') => out.push('\n'),
            Event::Start(Tag::CodeBlock(_)) => out.push_str("```\n"),
            Event::End(TagEnd::CodeBlock) => out.push_str("```\n"),
            Event::End(TagEnd::Paragraph) => {
                out.push('\n');
                if list_depth == 0 {
                    out.push('\n');
                }
            }
            Event::Code(c) => {
                out.push('`');
                out.push_str(&slack_escape(&c));
                out.push('`');
            }
            Event::Text(t) | Event::Html(t) | Event::InlineHtml(t) => {
                out.push_str(&slack_escape(&t))
            }
            Event::SoftBreak | Event::HardBreak => out.push('\n'),
            Event::Rule => out.push_str("———\n"),
            _ => {}
        }
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_for_matrix() {
        assert_eq!(
            to_html("**done**: `ls`"),
            "<p><strong>done</strong>: <code>ls</code></p>"
        );
        // Raw HTML from the text is shown, never rendered.
        assert_eq!(
            to_html("<img src=x onerror=alert(1)>"),
            "&lt;img src=x onerror=alert(1)&gt;"
        );
    }

    #[test]
    fn mrkdwn_for_slack() {
        assert_eq!(
            to_mrkdwn("### Summary\n**Done** with [PR](https://x.test/1) and `a<b`"),
            "*Summary*\n*Done* with <https://x.test/1|PR> and `a&lt;b`"
        );
        assert_eq!(to_mrkdwn("- one\n- two"), "• one\n• two");
    }
}
