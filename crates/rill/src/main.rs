//! `rill`: the one binary — server, command line, benchmark.

fn main() {
    println!("rill");
}
