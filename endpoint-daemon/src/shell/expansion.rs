//! The word-level half of [`Walker`]: a word's pieces (quotes, escapes,
//! `~`, parameter, command and arithmetic expansions) become an [`Arg`],
//! and the commands those expansions run are walked in turn; assignments
//! and arithmetic record the variables a line may set. The parent module
//! walks the command structure (lists, pipelines, compounds, redirections)
//! and hands each word here.

use brush_parser::ast;
use brush_parser::word::{Parameter, ParameterExpr, TildeExpr, WordPiece, WordPieceWithSource};

use super::words::{ansi_c, GlobScan, Quote};
use super::{options, Arg, Part, Walker};

impl Walker {
    pub(super) fn assignment(&mut self, a: &ast::Assignment) -> (String, Arg) {
        let name = match &a.name {
            ast::AssignmentName::VariableName(n) => n.clone(),
            ast::AssignmentName::ArrayElementName(n, index) => {
                self.arithmetic(index);
                n.clone()
            }
        };
        self.out.assigned.insert(name.clone());
        let value = match &a.value {
            ast::AssignmentValue::Scalar(w) => self.word(w),
            ast::AssignmentValue::Array(items) => {
                for (k, v) in items {
                    if let Some(k) = k {
                        self.word(k);
                    }
                    self.word(v);
                }
                Arg::dynamic()
            }
        };
        (name, value)
    }

    /// Text the shell evaluates as arithmetic: only its substitutions run,
    /// but it may assign the variables it names.
    pub(super) fn arithmetic(&mut self, text: &str) {
        self.evaluates = true;
        self.arith_names(text);
        self.expansion_text(text);
    }

    /// The variables arithmetic text names may be assigned (`x=1`, `x++`),
    /// and their values are evaluated in turn.
    pub(super) fn arith_names(&mut self, text: &str) {
        let mut name = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                continue;
            }
            if name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                self.out.arith_vars = true;
                self.out.assigned.insert(std::mem::take(&mut name));
            }
            name.clear();
        }
    }

    /// Text inside `${…}` or `$((…))`: the commands it substitutes run.
    fn expansion_text(&mut self, text: &str) {
        if !text.contains("$(") && !text.contains('`') && !text.contains("${") {
            return;
        }
        match brush_parser::word::parse(text, &options()) {
            Ok(pieces) => {
                let mut sink = Arg::default();
                let mut g = GlobScan::default();
                self.pieces(&pieces, text, Quote::Double, &mut sink, &mut g);
            }
            Err(_) => self
                .out
                .unknowable("an expansion whose commands cannot be parsed"),
        }
    }

    pub(super) fn word(&mut self, w: &ast::Word) -> Arg {
        let mut arg = Arg::default();
        match brush_parser::word::parse(&w.value, &options()) {
            Ok(pieces) => {
                let mut g = GlobScan::default();
                self.pieces(&pieces, &w.value, Quote::Bare, &mut arg, &mut g)
            }
            Err(_) => {
                self.out
                    .unknowable(format!("a word that does not parse: {}", w.value));
                arg.parts.push(Part::Dyn);
            }
        }
        // `a[$(cmd)]` is what bash arithmetic runs.
        if arg.parts.iter().any(
            |p| matches!(p, Part::Lit(t) if t.contains('[') && (t.contains("$(") || t.contains('`'))),
        ) {
            self.code_in_text = true;
        }
        arg
    }

    pub(super) fn pieces(
        &mut self,
        pieces: &[WordPieceWithSource],
        raw: &str,
        q: Quote,
        arg: &mut Arg,
        g: &mut GlobScan,
    ) {
        let bare = q == Quote::Bare;
        for p in pieces {
            let text = |p: &WordPieceWithSource| raw.get(p.start_index..p.end_index).unwrap_or("");
            // What the shell knows only when it runs: split if unquoted.
            let dynamic = |arg: &mut Arg, g: &mut GlobScan, splits: bool| {
                arg.parts.push(Part::Dyn);
                arg.splits |= splits;
                g.other(arg);
            };
            match &p.piece {
                WordPiece::Text(t) if bare => {
                    g.bare(t, arg);
                    arg.parts.push(Part::Lit(t.clone()));
                }
                WordPiece::Text(t) | WordPiece::SingleQuotedText(t) => {
                    g.quoted(t, arg);
                    arg.parts.push(Part::Lit(t.clone()));
                }
                WordPiece::AnsiCQuotedText(t) => {
                    let t = ansi_c(t);
                    g.quoted(&t, arg);
                    arg.parts.push(Part::Lit(t));
                }
                WordPiece::DoubleQuotedSequence(seq)
                | WordPiece::GettextDoubleQuotedSequence(seq) => {
                    let inner = if q == Quote::HereDoc {
                        q
                    } else {
                        Quote::Double
                    };
                    self.pieces(seq, raw, inner, arg, g);
                }
                WordPiece::TildeExpansion(t) => match (t, &self.home) {
                    (TildeExpr::Home, Some(h)) => arg.parts.push(Part::Lit(h.clone())),
                    _ => dynamic(arg, g, false),
                },
                WordPiece::ParameterExpansion(e) => {
                    let src = text(p);
                    if let Some(inner) = src.strip_prefix("${").and_then(|s| s.strip_suffix('}')) {
                        self.expansion_text(inner);
                    }
                    self.parameter(e);
                    let home = matches!(
                        e,
                        ParameterExpr::Parameter { parameter: Parameter::Named(n), indirect: false } if n == "HOME"
                    ) && !self.out.assigned.contains("HOME");
                    match (home, &self.home) {
                        (true, Some(h)) => arg.parts.push(Part::Lit(h.clone())),
                        // `"$@"` and `"${a[@]}"` are several words.
                        _ => dynamic(arg, g, bare || src.contains('@')),
                    }
                }
                WordPiece::CommandSubstitution(s) => {
                    self.nested(s);
                    dynamic(arg, g, bare);
                }
                WordPiece::BackquotedCommandSubstitution(s) => {
                    // In backquotes `\$` and `\\` lose their backslash
                    // before the inner line is parsed.
                    let mut inner = String::with_capacity(s.len());
                    let mut chars = s.chars().peekable();
                    while let Some(c) = chars.next() {
                        if c == '\\' && matches!(chars.peek(), Some('$') | Some('\\')) {
                            continue;
                        }
                        inner.push(c);
                    }
                    self.nested(&inner);
                    dynamic(arg, g, bare);
                }
                WordPiece::EscapeSequence(s) => {
                    let mut cs = s.chars();
                    cs.next();
                    let rest: String = cs.collect();
                    // Inside double quotes a backslash escapes only these;
                    // in a here-document `"` is not one of them.
                    let escaped = match q {
                        Quote::Bare => true,
                        Quote::Double => matches!(rest.as_str(), "$" | "`" | "\"" | "\\" | "\n"),
                        Quote::HereDoc => matches!(rest.as_str(), "$" | "`" | "\\" | "\n"),
                    };
                    match (escaped, rest.as_str()) {
                        (true, "\n") => {}
                        (true, _) => {
                            g.quoted(&rest, arg);
                            arg.parts.push(Part::Lit(rest))
                        }
                        (false, _) => {
                            g.quoted(s, arg);
                            arg.parts.push(Part::Lit(s.clone()))
                        }
                    }
                }
                WordPiece::ArithmeticExpression(e) => {
                    self.arithmetic(&e.value);
                    dynamic(arg, g, bare);
                }
            }
        }
    }

    /// What a parameter expansion assigns or evaluates as arithmetic.
    fn parameter(&mut self, e: &ParameterExpr) {
        match e {
            ParameterExpr::AssignDefaultValues {
                parameter,
                indirect,
                ..
            } => match (name_of(parameter), indirect) {
                (Some(n), false) => {
                    self.out.assigned.insert(n.to_string());
                }
                _ => self
                    .out
                    .unknowable("an expansion assigns a variable only known when it runs"),
            },
            ParameterExpr::Substring { offset, length, .. } => {
                self.arith_names(&offset.value);
                if let Some(l) = length {
                    self.arith_names(&l.value);
                }
            }
            _ => {}
        }
        if let ParameterExpr::Parameter {
            parameter: Parameter::NamedWithIndex { index, .. },
            ..
        } = e
        {
            self.arith_names(index);
        }
    }
}

/// The variable a parameter names, if it is one.
fn name_of(p: &Parameter) -> Option<&str> {
    match p {
        Parameter::Named(n)
        | Parameter::NamedWithIndex { name: n, .. }
        | Parameter::NamedWithAllIndices { name: n, .. } => Some(n),
        _ => None,
    }
}
