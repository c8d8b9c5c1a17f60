fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let m = vkfuse_compiler::import::load(std::path::Path::new(&dir)).unwrap();
    let p = vkfuse_compiler::trace::trace(&m, &Default::default()).unwrap();
    if std::env::args().nth(2).is_some() {
        for id in p.op_ids() {
            println!("{:4} {}", id.index(), p.op_line(id));
        }
    }
    print!("{}", vkfuse_compiler::fuse::discover(&p));
}
