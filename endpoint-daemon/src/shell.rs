//! Shell lines as a shell will run them. The local policy judges commands,
//! not text: `s''u`, `\su` and `$'s\x75'` all run `su`, and `$(su)` inside
//! an argument runs it too. This module parses a line with `brush-parser`
//! (a maintained POSIX/bash parser), removes quotes and escapes, and lists
//! every simple command the line may run (command substitutions, process
//! substitutions, here-documents and compound commands included) with its
//! words. What only the running shell can know (a word built from a
//! variable, a glob, a line too deep or too long to parse) is marked as
//! such, never guessed.
//!
//! Key types: [`Script`] (the commands of a line), [`Simple`] (one simple
//! command), [`Arg`] (one word, with what is known of it).

use std::collections::BTreeSet;

use brush_parser::ast;
use brush_parser::word::{Parameter, ParameterExpr, TildeExpr, WordPiece, WordPieceWithSource};

/// Longest shell text analysed; anything longer cannot be known.
pub const MAX_SCRIPT_BYTES: usize = 256 * 1024;
/// Deepest nesting of brackets and compound commands handed to the parser,
/// which recurses on them (an over-estimate counted before parsing).
pub const MAX_NESTING: usize = 200;
/// Deepest nesting of lines within lines (`$( )`, `sh -c`, `eval`).
pub const MAX_DEPTH: usize = 16;
/// Most simple commands listed for one line, nested ones included.
pub const MAX_COMMANDS: usize = 10_000;
/// The parser runs on its own thread with this much stack, so no line that
/// passes [`MAX_NESTING`] can overflow it.
const PARSE_STACK_BYTES: usize = 64 << 20;

/// One piece of a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text known now (quotes and escapes removed, `~` resolved).
    Lit(String),
    /// Text only the running shell knows: a variable, a substitution.
    Dyn,
}

/// One word of a command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Arg {
    pub parts: Vec<Part>,
    /// Unquoted glob or brace characters: the shell may turn the word into
    /// other words.
    pub expands: bool,
}

impl Arg {
    pub fn lit(s: impl Into<String>) -> Arg {
        Arg {
            parts: vec![Part::Lit(s.into())],
            expands: false,
        }
    }

    pub fn dynamic() -> Arg {
        Arg {
            parts: vec![Part::Dyn],
            expands: false,
        }
    }

    /// The word's text, when the shell will pass exactly that.
    pub fn literal(&self) -> Option<String> {
        if self.expands {
            return None;
        }
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(t) => s.push_str(t),
                Part::Dyn => return None,
            }
        }
        Some(s)
    }

    /// The known text, with the unknown parts left out.
    pub fn known(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Lit(t) => Some(t.as_str()),
                Part::Dyn => None,
            })
            .collect()
    }

    pub fn is_dynamic(&self) -> bool {
        self.parts.contains(&Part::Dyn)
    }

    /// For messages: the text with unknown parts shown as `…`.
    pub fn shown(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Lit(t) => t.as_str(),
                Part::Dyn => "…",
            })
            .collect()
    }
}

/// One simple command: what it sets and the words it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Simple {
    /// `NAME=value` words before the command.
    pub assigns: Vec<(String, Arg)>,
    /// The command's words, redirections removed; may be empty.
    pub words: Vec<Arg>,
}

/// Every simple command a shell line may run.
#[derive(Debug, Clone, Default)]
pub struct Script {
    pub commands: Vec<Simple>,
    /// Why some of what the line runs cannot be known before it runs.
    pub unknown: Vec<String>,
    /// Functions the line defines (calling one runs its body, listed too).
    pub functions: BTreeSet<String>,
    /// Variables the line assigns anywhere.
    pub assigned: BTreeSet<String>,
}

impl Script {
    pub fn unknowable(&mut self, why: impl Into<String>) {
        add_reason(&mut self.unknown, why);
    }
}

/// Most reasons kept for one command (the first say enough).
pub const MAX_REASONS: usize = 16;

/// Adds a reason something is unknowable, once, up to [`MAX_REASONS`].
pub fn add_reason(list: &mut Vec<String>, why: impl Into<String>) {
    let why = why.into();
    if !list.contains(&why) && list.len() < MAX_REASONS {
        list.push(why);
    }
}

/// Parses `text` as `sh -c` would, with `home` for `~` and `$HOME`.
/// `depth` is how deep this line already is inside others.
pub fn parse(text: &str, home: Option<&str>, depth: usize) -> Script {
    let mut w = Walker {
        out: Script::default(),
        home: home.map(str::to_string),
        depth,
        code_in_text: false,
        evaluates: false,
    };
    let text = text.to_string();
    // The parser recurses per nesting level: the whole walk runs on a
    // thread with a stack sized for MAX_NESTING.
    let walk = move || {
        w.program(&text);
        if w.code_in_text && w.evaluates {
            // bash evaluates `a[$(cmd)]` in quoted text given to
            // arithmetic, `let`, `declare`, `printf -v`, `[[ -eq ]]`…
            w.out.unknowable(
                "quoted text containing `$(…)` reaches a command bash may evaluate it in",
            );
        }
        w.out
    };
    let failed = |why: String| {
        let mut s = Script::default();
        s.unknowable(why);
        s
    };
    match std::thread::Builder::new()
        .name("shell-parse".into())
        .stack_size(PARSE_STACK_BYTES)
        .spawn(walk)
    {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| failed("the shell parser failed on it".into())),
        Err(e) => failed(format!("cannot start the shell parser: {e}")),
    }
}

/// An over-estimate of how deep `text` nests (quotes ignored).
fn nesting(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut word = String::new();
    let on_word = |w: &str, depth: &mut usize| match w {
        "if" | "case" | "do" => *depth += 1,
        "fi" | "esac" | "done" => *depth = depth.saturating_sub(1),
        _ => {}
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        on_word(&word, &mut depth);
        word.clear();
        match c {
            '(' | '{' | '[' | '`' => depth += 1,
            ')' | '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        max = max.max(depth);
    }
    on_word(&word, &mut depth);
    max.max(depth)
}

/// Parses one line; a panic in the parser is a line it cannot parse.
fn parse_program(text: &str) -> Result<ast::Program, String> {
    let opts = options();
    let mut p = brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &opts);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.parse_program()))
        .map_err(|_| "the shell parser failed on it".to_string())?
        .map_err(|e| e.to_string())
}

fn options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions {
        // Off in a non-interactive bash; dash has none.
        enable_extended_globbing: false,
        ..Default::default()
    }
}

struct Walker {
    out: Script,
    home: Option<String>,
    depth: usize,
    /// Some known text contains `[` and `$(` or a backquote.
    code_in_text: bool,
    /// The line has a place bash evaluates text as arithmetic.
    evaluates: bool,
}

/// Builtins that evaluate their arguments as arithmetic (or may).
const EVALUATING: &[&str] = &[
    "let",
    "declare",
    "typeset",
    "local",
    "export",
    "readonly",
    "printf",
    "read",
    "unset",
    "test",
    "[",
    "mapfile",
    "readarray",
    "shift",
    "return",
    "exit",
    "wait",
];

impl Walker {
    fn program(&mut self, text: &str) {
        if self.depth > MAX_DEPTH {
            self.out
                .unknowable(format!("commands nested more than {MAX_DEPTH} levels deep"));
            return;
        }
        if text.len() > MAX_SCRIPT_BYTES {
            self.out.unknowable(format!(
                "a shell line longer than {} KiB",
                MAX_SCRIPT_BYTES / 1024
            ));
            return;
        }
        if nesting(text) > MAX_NESTING {
            self.out.unknowable(format!(
                "a shell line nested more than {MAX_NESTING} levels deep"
            ));
            return;
        }
        match parse_program(text) {
            Ok(p) => {
                for cc in &p.complete_commands {
                    self.list(cc);
                }
            }
            Err(e) => self
                .out
                .unknowable(format!("a shell line that does not parse ({e})")),
        }
    }

    fn nested(&mut self, text: &str) {
        self.depth += 1;
        self.program(text);
        self.depth -= 1;
    }

    fn list(&mut self, l: &ast::CompoundList) {
        for item in &l.0 {
            self.and_or(&item.0);
        }
    }

    fn and_or(&mut self, a: &ast::AndOrList) {
        self.pipeline(&a.first);
        for x in &a.additional {
            match x {
                ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
            }
        }
    }

    fn pipeline(&mut self, p: &ast::Pipeline) {
        for c in &p.seq {
            self.command(c);
        }
    }

    fn command(&mut self, c: &ast::Command) {
        match c {
            ast::Command::Simple(s) => self.simple(s),
            ast::Command::Compound(cc, redirects) => {
                self.compound(cc);
                self.redirects(redirects.as_ref());
            }
            ast::Command::Function(f) => {
                match self.word(&f.fname).literal() {
                    Some(n) => {
                        self.out.functions.insert(n);
                    }
                    None => self
                        .out
                        .unknowable("a function whose name is only known when it runs"),
                }
                self.compound(&f.body.0);
                self.redirects(f.body.1.as_ref());
            }
            ast::Command::ExtendedTest(t, redirects) => {
                self.evaluates = true;
                self.test_expr(&t.expr);
                self.redirects(redirects.as_ref());
            }
        }
    }

    fn test_expr(&mut self, e: &ast::ExtendedTestExpr) {
        match e {
            ast::ExtendedTestExpr::And(a, b) | ast::ExtendedTestExpr::Or(a, b) => {
                self.test_expr(a);
                self.test_expr(b);
            }
            ast::ExtendedTestExpr::Not(a) | ast::ExtendedTestExpr::Parenthesized(a) => {
                self.test_expr(a)
            }
            ast::ExtendedTestExpr::UnaryTest(_, w) => {
                self.word(w);
            }
            ast::ExtendedTestExpr::BinaryTest(_, a, b) => {
                self.word(a);
                self.word(b);
            }
        }
    }

    fn compound(&mut self, c: &ast::CompoundCommand) {
        use ast::CompoundCommand as C;
        match c {
            C::Arithmetic(a) => self.arithmetic(&a.expr.value),
            C::ArithmeticForClause(f) => {
                for e in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&e.value);
                }
                self.list(&f.body.list);
            }
            C::BraceGroup(b) => self.list(&b.list),
            C::Subshell(s) => self.list(&s.list),
            C::ForClause(f) => {
                self.out.assigned.insert(f.variable_name.clone());
                for w in f.values.iter().flatten() {
                    self.word(w);
                }
                self.list(&f.body.list);
            }
            C::CaseClause(c) => {
                self.word(&c.value);
                for item in &c.cases {
                    for p in &item.patterns {
                        self.word(p);
                    }
                    if let Some(l) = &item.cmd {
                        self.list(l);
                    }
                }
            }
            C::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.list(c);
                    }
                    self.list(&e.body);
                }
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1.list);
            }
            C::Coprocess(c) => {
                if let Some(n) = &c.name {
                    self.word(n);
                }
                self.command(&c.body);
            }
        }
    }

    fn redirects(&mut self, r: Option<&ast::RedirectList>) {
        for r in r.iter().flat_map(|r| r.0.iter()) {
            self.redirect(r);
        }
    }

    fn redirect(&mut self, r: &ast::IoRedirect) {
        match r {
            ast::IoRedirect::File(_, _, target) => match target {
                ast::IoFileRedirectTarget::Filename(w)
                | ast::IoFileRedirectTarget::Duplicate(w) => {
                    self.word(w);
                }
                ast::IoFileRedirectTarget::Fd(_) => {}
                ast::IoFileRedirectTarget::ProcessSubstitution(_, s) => self.list(&s.list),
            },
            ast::IoRedirect::HereDocument(_, h) => {
                if h.requires_expansion {
                    match brush_parser::word::parse_heredoc(&h.doc.value, &options()) {
                        Ok(pieces) => {
                            let mut sink = Arg::default();
                            self.pieces(&pieces, &h.doc.value, true, &mut sink);
                        }
                        Err(_) => self.out.unknowable("a here-document that does not parse"),
                    }
                }
            }
            ast::IoRedirect::HereString(_, w) | ast::IoRedirect::OutputAndError(w, _) => {
                self.word(w);
            }
        }
    }

    fn simple(&mut self, s: &ast::SimpleCommand) {
        let mut cmd = Simple::default();
        for item in s.prefix.iter().flat_map(|p| p.0.iter()) {
            self.item(item, &mut cmd, true);
        }
        if let Some(w) = &s.word_or_name {
            let a = self.word(w);
            cmd.words.push(a);
        }
        for item in s.suffix.iter().flat_map(|p| p.0.iter()) {
            self.item(item, &mut cmd, false);
        }
        if let Some(p) = cmd.words.first().and_then(Arg::literal) {
            if EVALUATING.contains(&p.as_str()) {
                self.evaluates = true;
            }
        }
        if self.out.commands.len() >= MAX_COMMANDS {
            self.out
                .unknowable(format!("more than {MAX_COMMANDS} commands in one line"));
            return;
        }
        self.out.commands.push(cmd);
    }

    /// One word, redirection or assignment around a command's name.
    fn item(&mut self, item: &ast::CommandPrefixOrSuffixItem, cmd: &mut Simple, before_name: bool) {
        use ast::CommandPrefixOrSuffixItem as I;
        match item {
            I::IoRedirect(r) => self.redirect(r),
            I::Word(w) => cmd.words.push(self.word(w)),
            I::AssignmentWord(a, _) => {
                let (name, value) = self.assignment(a);
                if before_name {
                    cmd.assigns.push((name, value));
                } else {
                    // `export A=$(x)`: an argument, `A=` and its value.
                    let mut arg = Arg::lit(format!("{name}="));
                    arg.parts.extend(value.parts);
                    arg.expands = value.expands;
                    cmd.words.push(arg);
                }
            }
            I::ProcessSubstitution(_, sub) => {
                self.list(&sub.list);
                cmd.words.push(Arg::dynamic());
            }
        }
    }

    fn assignment(&mut self, a: &ast::Assignment) -> (String, Arg) {
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

    /// Text the shell evaluates as arithmetic: only its substitutions run.
    fn arithmetic(&mut self, text: &str) {
        self.evaluates = true;
        self.expansion_text(text);
    }

    /// Text inside `${…}` or `$((…))`: the commands it substitutes run.
    fn expansion_text(&mut self, text: &str) {
        if !text.contains("$(") && !text.contains('`') && !text.contains("${") {
            return;
        }
        match brush_parser::word::parse(text, &options()) {
            Ok(pieces) => {
                let mut sink = Arg::default();
                self.pieces(&pieces, text, true, &mut sink);
            }
            Err(_) => self
                .out
                .unknowable("an expansion whose commands cannot be parsed"),
        }
    }

    fn word(&mut self, w: &ast::Word) -> Arg {
        let mut arg = Arg::default();
        match brush_parser::word::parse(&w.value, &options()) {
            Ok(pieces) => self.pieces(&pieces, &w.value, false, &mut arg),
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

    fn pieces(&mut self, pieces: &[WordPieceWithSource], raw: &str, quoted: bool, arg: &mut Arg) {
        for p in pieces {
            let text = |p: &WordPieceWithSource| raw.get(p.start_index..p.end_index).unwrap_or("");
            match &p.piece {
                WordPiece::Text(t) => {
                    if !quoted && t.contains(['*', '?', '[', ']', '{', '}']) {
                        arg.expands = true;
                    }
                    arg.parts.push(Part::Lit(t.clone()));
                }
                WordPiece::SingleQuotedText(t) => arg.parts.push(Part::Lit(t.clone())),
                WordPiece::AnsiCQuotedText(t) => arg.parts.push(Part::Lit(ansi_c(t))),
                WordPiece::DoubleQuotedSequence(seq)
                | WordPiece::GettextDoubleQuotedSequence(seq) => {
                    self.pieces(seq, raw, true, arg);
                }
                WordPiece::TildeExpansion(t) => match (t, &self.home) {
                    (TildeExpr::Home, Some(h)) => arg.parts.push(Part::Lit(h.clone())),
                    _ => arg.parts.push(Part::Dyn),
                },
                WordPiece::ParameterExpansion(e) => {
                    let src = text(p);
                    if let Some(inner) = src.strip_prefix("${").and_then(|s| s.strip_suffix('}')) {
                        self.expansion_text(inner);
                    }
                    let home = matches!(
                        e,
                        ParameterExpr::Parameter { parameter: Parameter::Named(n), indirect: false } if n == "HOME"
                    ) && !self.out.assigned.contains("HOME");
                    match (home, &self.home) {
                        (true, Some(h)) => arg.parts.push(Part::Lit(h.clone())),
                        _ => arg.parts.push(Part::Dyn),
                    }
                }
                WordPiece::CommandSubstitution(s) => {
                    self.nested(s);
                    arg.parts.push(Part::Dyn);
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
                    arg.parts.push(Part::Dyn);
                }
                WordPiece::EscapeSequence(s) => {
                    let mut cs = s.chars();
                    cs.next();
                    let rest: String = cs.collect();
                    let escaped =
                        !quoted || matches!(rest.as_str(), "$" | "`" | "\"" | "\\" | "\n");
                    match (escaped, rest.as_str()) {
                        (true, "\n") => {}
                        (true, _) => arg.parts.push(Part::Lit(rest)),
                        (false, _) => arg.parts.push(Part::Lit(s.clone())),
                    }
                }
                WordPiece::ArithmeticExpression(e) => {
                    self.arithmetic(&e.value);
                    arg.parts.push(Part::Dyn);
                }
            }
        }
    }
}

/// Decodes bash's `$'…'` escapes.
fn ansi_c(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let cs: Vec<char> = t.chars().collect();
    let mut i = 0;
    let digits = |from: usize, max: usize, radix: u32| -> (u32, usize) {
        let mut v = 0u32;
        let mut n = 0;
        while n < max {
            match cs.get(from + n).and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v.saturating_mul(radix).saturating_add(d);
                    n += 1;
                }
                None => break,
            }
        }
        (v, n)
    };
    while i < cs.len() {
        if cs[i] != '\\' || i + 1 == cs.len() {
            out.push(cs[i]);
            i += 1;
            continue;
        }
        let c = cs[i + 1];
        i += 2;
        let simple = match c {
            'a' => Some('\u{7}'),
            'b' => Some('\u{8}'),
            'e' | 'E' => Some('\u{1b}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\u{b}'),
            '\\' | '\'' | '"' | '?' => Some(c),
            _ => None,
        };
        if let Some(s) = simple {
            out.push(s);
            continue;
        }
        let (v, n) = match c {
            '0'..='7' => {
                let (v, n) = digits(i - 1, 3, 8);
                i -= 1;
                (v, n)
            }
            'x' => digits(i, 2, 16),
            'u' => digits(i, 4, 16),
            'U' => digits(i, 8, 16),
            'c' if i < cs.len() => {
                let ctl = (cs[i] as u32) & 0x1f;
                i += 1;
                out.extend(char::from_u32(ctl));
                continue;
            }
            _ => {
                out.push('\\');
                out.push(c);
                continue;
            }
        };
        if n == 0 {
            out.push('\\');
            out.push(c);
            continue;
        }
        i += n;
        out.extend(char::from_u32(v));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_words(line: &str) -> Vec<Option<String>> {
        let s = parse(line, Some("/home/u"), 0);
        assert!(s.unknown.is_empty(), "{line}: {:?}", s.unknown);
        s.commands
            .iter()
            .map(|c| c.words.first().and_then(Arg::literal))
            .collect()
    }

    #[test]
    fn quotes_and_escapes_are_removed() {
        for line in [
            "s''u -c id",
            "\\su -c id",
            "\"s\"u",
            "$'s\\x75'",
            "$'\\163u'",
            "'su'",
        ] {
            assert_eq!(first_words(line), vec![Some("su".to_string())], "{line}");
        }
    }

    #[test]
    fn every_command_is_found() {
        assert_eq!(
            first_words("a; b && c || d | e & f\n(g); { h; }"),
            ["a", "b", "c", "d", "e", "f", "g", "h"]
                .map(|s| Some(s.to_string()))
                .to_vec()
        );
        let s = parse(
            "echo $(su) `doas x` \"$(sudo y)\" <(pkexec z) ${a:-$(reboot)}",
            None,
            0,
        );
        let progs: Vec<_> = s
            .commands
            .iter()
            .filter_map(|c| c.words.first().and_then(Arg::literal))
            .collect();
        for p in ["su", "doas", "sudo", "pkexec", "reboot", "echo"] {
            assert!(progs.contains(&p.to_string()), "{p} in {progs:?}");
        }
        let s = parse("cat <<EOF\n$(su)\nEOF\nif x; then y; elif z; then w; else v; fi; for i in 1; do q; done; case a in b) r;; esac; f() { t; }", None, 0);
        let progs: Vec<_> = s
            .commands
            .iter()
            .filter_map(|c| c.words.first().and_then(Arg::literal))
            .collect();
        for p in ["cat", "su", "x", "y", "z", "w", "v", "q", "r", "t"] {
            assert!(progs.contains(&p.to_string()), "{p} in {progs:?}");
        }
        assert!(s.functions.contains("f"));
        // A quoted here-document is text, not commands.
        let s = parse("cat <<'EOF'\n$(su)\nEOF", None, 0);
        assert_eq!(s.commands.len(), 1);
    }

    #[test]
    fn what_the_shell_builds_is_dynamic() {
        let s = parse("x=s; ${x}u -c id", None, 0);
        assert_eq!(s.commands[1].words[0].literal(), None);
        assert!(s.commands[1].words[0].is_dynamic());
        assert!(s.assigned.contains("x"));
        let s = parse("/bin/s? -c id; {s,}u", None, 0);
        assert_eq!(s.commands[0].words[0].literal(), None);
        assert_eq!(s.commands[1].words[0].literal(), None);
        // Quoted glob characters are text.
        let s = parse("echo '*'", None, 0);
        assert_eq!(s.commands[0].words[1].literal().as_deref(), Some("*"));
        let s = parse("rm -rf ~ $HOME/ \"$X/\"", Some("/home/u"), 0);
        let w = &s.commands[0].words;
        assert_eq!(w[2].literal().as_deref(), Some("/home/u"));
        assert_eq!(w[3].literal().as_deref(), Some("/home/u/"));
        assert_eq!(w[4].known(), "/");
    }

    #[test]
    fn what_cannot_be_parsed_is_unknown_not_a_crash() {
        assert!(!parse("echo 'unterminated", None, 0).unknown.is_empty());
        let deep = format!("{}x{}", "(".repeat(5000), ")".repeat(5000));
        assert!(!parse(&deep, None, 0).unknown.is_empty());
        let mut nested = "x".to_string();
        for _ in 0..40 {
            nested = format!("echo $({nested})");
        }
        assert!(!parse(&nested, None, 0).unknown.is_empty());
        assert!(!parse(&"a".repeat(MAX_SCRIPT_BYTES + 1), None, 0)
            .unknown
            .is_empty());
        // Deep but allowed: parsed, not refused.
        let ok = format!("{}x{}", "(".repeat(150), ")".repeat(150));
        assert!(parse(&ok, None, 0).unknown.is_empty());
    }

    #[test]
    fn arithmetic_injection_is_unknown() {
        assert!(!parse("x='a[$(su)]'; echo $((x))", None, 0)
            .unknown
            .is_empty());
        assert!(parse("echo '$(date)'", None, 0).unknown.is_empty());
        assert!(parse("printf '%s' 'see $(x)'", None, 0).unknown.is_empty());
    }

    #[test]
    fn ansi_c_escapes() {
        assert_eq!(ansi_c("s\\x75"), "su");
        assert_eq!(ansi_c("\\163\\165"), "su");
        assert_eq!(ansi_c("\\u0073u"), "su");
        assert_eq!(ansi_c("a\\tb\\q"), "a\tb\\q");
        assert_eq!(ansi_c("\\"), "\\");
    }
}
