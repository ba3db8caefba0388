//! Random `.coll` programs for the property suite, built from a tape of random words so that proptest can shrink
//! them: expressions over the names in scope, sends, copies, reduces, `let`, `for ... by`, `if/else` and `step`.

/// A random program generator reading its choices off a tape of random words; past the tape's end every choice
/// is 0, so shrinking the tape shortens the program. Names are drawn from those in scope, so most programs lower.
struct Gen {
    words: Vec<u32>,
    at: usize,
    scope: Vec<&'static str>,
}

const NUMBERS: &[&str] = &["0", "1", "2", "3", "-1", "64", "1000000", "9223372036854775807", "-9223372036854775807"];
const OPERATORS: &[&str] = &["+", "-", "*", "/", "%", "**", "&", "|", "^", "<<", ">>", "==", "<", ">=", "&&", "||"];

impl Gen {
    fn next(&mut self, n: usize) -> usize {
        let word = self.words.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        word as usize % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.next(items.len())]
    }

    fn expr(&mut self, depth: u32) -> String {
        match if depth > 2 { self.next(2) } else { self.next(7) } {
            0 => self.pick(NUMBERS).to_string(),
            1 | 2 => {
                let at = self.next(self.scope.len());
                self.scope[at].to_string()
            }
            3 | 4 => format!("({} {} {})", self.expr(depth + 1), self.pick(OPERATORS), self.expr(depth + 1)),
            5 => format!("{}({})", self.pick(&["log2", "clog2", "pow2", "abs", "min", "f"]), self.expr(depth + 1)),
            _ => format!(
                "if {} {{ {} }} else {{ {} }}",
                self.expr(depth + 1),
                self.expr(depth + 1),
                self.expr(depth + 1)
            ),
        }
    }

    fn buf_ref(&mut self) -> String {
        let buf = self.pick(&["in", "out", "tmp"]);
        match self.next(2) {
            0 => format!("{buf}[{} % p]", self.expr(1)),
            _ => format!("{buf}[{}..{}]", self.expr(2), self.expr(2)),
        }
    }

    fn block(&mut self, depth: u32) -> String {
        let outer = self.scope.len();
        let body: Vec<String> = (0..self.next(4)).map(|_| self.stmt(depth)).collect();
        self.scope.truncate(outer);
        body.join("\n")
    }

    fn stmt(&mut self, depth: u32) -> String {
        let var = self.pick(&["r", "s", "q"]);
        match if depth > 2 { self.next(4) } else { self.next(8) } {
            0 => {
                let flag = self.pick(&["", " reduce", " channel 1"]);
                format!("send {} from {} % p to {} % p{flag}", self.buf_ref(), self.expr(1), self.expr(1))
            }
            1 => format!(
                "send {} from {} % p to {} % p as {}",
                self.buf_ref(),
                self.expr(1),
                self.expr(1),
                self.buf_ref()
            ),
            2 => {
                let (verb, link) = if self.next(2) == 0 { ("copy", "to") } else { ("reduce", "into") };
                format!("{verb} {} {link} {} on {} % p", self.buf_ref(), self.buf_ref(), self.expr(1))
            }
            3 => {
                let value = self.expr(0);
                self.scope.push(var);
                format!("let {var} = {value}")
            }
            4 => format!("step {{\n{}\n}}", self.block(depth + 1)),
            5 => {
                format!("if {} {{\n{}\n}} else {{\n{}\n}}", self.expr(1), self.block(depth + 1), self.block(depth + 1))
            }
            _ => {
                let by = if self.next(2) == 0 { String::new() } else { format!(" by {}", self.expr(2)) };
                let range = format!("{}..{}{by}", self.expr(1), self.expr(1));
                self.scope.push(var);
                let body = self.block(depth + 1);
                self.scope.pop();
                format!("for {var} in {range} {{\n{body}\n}}")
            }
        }
    }
}

pub fn random_program(words: Vec<u32>) -> String {
    let mut g = Gen { words, at: 0, scope: vec!["x"] };
    let collective = g.pick(&["allreduce", "broadcast", "allgather", "reducescatter", "alltoall", "reduce", "gather"]);
    let function = format!("fn f(x) = {}\n", g.expr(1));
    g.scope = vec!["p", "k"];
    let chunks = format!("chunks {}\n", g.pick(&["1", "2", "p", "p - 1", "2 * p", "p * p"]));
    let scratch = format!("scratch tmp[{}]\n", g.pick(&["1", "p", "p * p", "0"]));
    let body = g.block(0);
    format!("algorithm g for {collective} {{\nranks p\nroot k\n{chunks}{scratch}{function}{body}\n}}\n")
}
