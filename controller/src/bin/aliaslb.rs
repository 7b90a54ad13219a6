//! `aliaslb`: the user-facing CLI.

fn main() {
    eprintln!("aliaslb: not implemented yet");
    std::process::exit(2);
}
